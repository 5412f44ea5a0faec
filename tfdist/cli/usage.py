"""What ``tfdist`` accepts, and its one-line refusals: ``tfdist COMMAND: error: ...``.

A bad flag or value exits 2 after one Keras-style line on stderr (``invalid_argument``),
whether absl refuses it while parsing or a command refuses it later.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Sequence

from absl import flags

from tfdist.cli import help as help_text
from tfdist.cli.flag_definitions import FLAGS, RAY_ONLY_TRAIN_FLAGS, READS, TFDIST_FLAGS
from tfdist.config import invalid_argument

COMMANDS = ("train", "launch", "bench", "manifest")


def error_line(command: str, message: object) -> str:
    """The line ``tfdist`` prints on stderr before it exits 2.

    Args:
        command: The command refused (``""`` when there is none yet).
        message: What is wrong, usually an ``invalid_argument`` error.
    """
    return f"tfdist{' ' + command if command else ''}: error: {message}"


def flag_error(error: flags.Error, command: str = "") -> str:
    """Words an absl parsing error like every other bad argument.

    An unknown flag gets a suggestion from ``command``'s own flags only (every tfdist flag
    when there is no command yet), never one of absl's.
    """
    if isinstance(error, flags.UnrecognizedFlagError):
        own = sorted(READS[command]) if command in READS else sorted(TFDIST_FLAGS)
        close = difflib.get_close_matches(error.flagname, own, n=1)
        where = f"tfdist {command} --help" if command else "tfdist --help"
        return str(
            invalid_argument(
                "flag",
                error.flagvalue,
                f"a flag of `tfdist{' ' + command if command else ''}` (see {where})",
                note=f"Did you mean --{close[0]}?" if close else "",
            )
        )
    match = re.fullmatch(r"flag --([\w-]+)=(.*?): .*", str(error), flags=re.DOTALL)
    if isinstance(error, flags.IllegalFlagValueError) and match and match.group(1) in FLAGS:
        kind = FLAGS[match.group(1)].flag_type()
        return str(
            invalid_argument(
                match.group(1),
                match.group(2),
                {"int": "an integer", "float": "a number", "bool": "true or false"}.get(kind, kind),
            )
        )
    return str(error)


def parse_flags(argv: Sequence[str]) -> list[str]:
    """Parses the flags in ``argv`` (absl's ``flags_parser``); exits 2 with one line on a bad flag.

    ``tfdist``, ``-h``/``--help``, ``help [COMMAND]`` and ``--version`` print their text
    (`tfdist.cli.help`) and exit 0 before any flag is parsed.

    Returns:
        ``argv`` without its flags: ``[program, COMMAND, args after --...]``.
    """
    text = help_text.requested(argv)
    if text is not None:
        sys.stdout.write(text)
        sys.exit(0)
    try:
        return FLAGS(list(argv))
    except flags.Error as e:
        command = next((a for a in argv[1:] if not a.startswith("-")), "")
        command = command if command in COMMANDS else ""
        print(error_line(command, flag_error(e, command)), file=sys.stderr)
        sys.exit(2)


def is_invalid_argument(error: ValueError) -> bool:
    """Whether ``error`` is a bad argument (worded by ``invalid_argument``), not a bug."""
    return str(error).startswith("Invalid value for argument")


def refuse_flags_not_read(command: str) -> None:
    """Raises on the first tfdist flag given that ``command`` does not read.

    A flag that parses and then does nothing would look like it worked, so each
    command takes only its own (`READS`); ``tfdist train`` takes the Ray
    flags only with ``--engine=ray``.
    """
    given = sorted(name for name in TFDIST_FLAGS if FLAGS[name].present)
    for name in given:
        if name not in READS[command]:
            owners = [c for c in COMMANDS if name in READS[c]]
            raise invalid_argument(
                name,
                FLAGS[name].value,
                f"no --{name} for `tfdist {command}`",
                note=f"--{name} is a flag of `tfdist {' / '.join(owners)}`.",
            )
        if command == "train" and name in RAY_ONLY_TRAIN_FLAGS and FLAGS.engine != "ray":
            raise invalid_argument(
                name,
                FLAGS[name].value,
                f"no --{name} without --engine=ray",
                note="The local engine runs one process; Ray's workers and restarts need Ray.",
            )

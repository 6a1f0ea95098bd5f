"""The parsers of `tensorgate serve`'s flag values that several topics share (argparse's `type=`): each
turns the text given into the value, or refuses it with the reason argparse prints."""

import argparse
from collections.abc import Callable


def boolean(text: str) -> bool:
    """A flag value as Triton's command line takes it: true/false, 1/0, yes/no, on/off."""
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def positive_int(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return count


def not_negative(number: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value >= 0:  # NaN too
            raise argparse.ArgumentTypeError("must be 0 or more")
        return value

    return parse

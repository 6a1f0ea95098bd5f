"""JSON as Triton and TF Serving read and write it: standard JSON plus the bare tokens NaN, Infinity and
-Infinity (rapidjson's kParseNanAndInfFlag and kWriteNanAndInfFlag). Triton's C++ client writes them for
non-finite inputs and reads them in answers. orjson refuses them and writes non-finite floats as null
(which rapidjson-based clients read as 0), so a body is parsed with orjson and, only when that fails and
the body holds one of those tokens, again with the json module; answers are written with orjson, and the
non-finite values of a float tensor are spliced in as raw tokens."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_TOKENS = {"nan": b"NaN", "inf": b"Infinity", "-inf": b"-Infinity"}


def loads(body: bytes | bytearray | memoryview) -> Any:
    """The document; ValueError with orjson's (or the json module's) message when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        error = str(e)
    raw = bytes(body)
    if b"NaN" in raw or b"Infinity" in raw:
        try:
            doc = json.loads(raw.decode("utf-8"))
            orjson.dumps(doc)  # the json module lets lone surrogates ("\ud800") through; orjson does not
            return doc
        except RecursionError:
            error = "nested too deeply"
        except TypeError as e:  # orjson: a lone surrogate is not UTF-8; nesting past its 255 levels
            error = str(e)
        except ValueError:  # JSONDecodeError, UnicodeDecodeError, too many digits: orjson's message says more
            pass
    raise ValueError(error)


def dumps(doc: Any) -> bytes:
    """The document, numpy arrays as JSON arrays."""
    return orjson.dumps(doc, option=_OPTIONS)


def non_finite(array: np.ndarray) -> bool:
    return array.dtype.kind == "f" and not np.isfinite(array).all()


def with_tokens(array: np.ndarray) -> orjson.Fragment:
    """The JSON of a float array holding non-finite values: orjson writes them as null (and a numeric
    array's JSON holds no other null), so each null is replaced, in order, by its token."""
    array = np.asarray(array)  # a numpy scalar (a row of a vector) stays 0-d
    array = np.ascontiguousarray(array) if array.ndim else array
    text = orjson.dumps(array if array.ndim else array[()], option=_OPTIONS)
    bad = array[~np.isfinite(array)]  # row-major, the order orjson writes them in
    pieces = text.split(b"null")
    out: list[bytes] = [b""] * (2 * len(bad) + 1)
    out[0::2] = pieces
    out[1::2] = [_TOKENS[str(v)] for v in bad.astype(np.float64).tolist()]
    return orjson.Fragment(b"".join(out))

"""Triton's errors for python models (part of `pb_utils`, server/backends/pb_utils.py): TritonError, what a
model answers for one request, and TritonModelException, what a failed call of ours raises to a model.
"""


class TritonError:
    """An error a model answers for one request (`InferenceResponse(error=...)`), with Triton's codes."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised to a model by a failed call of ours (a BLS call's transport, a wrong argument)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message

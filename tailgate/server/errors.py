"""The API's error: an HTTP status and OpenAI's error body. Its own module so the request parsers
(`protocol.py`) and what they call (`structured.py`, `tools.py`) all raise it without importing
each other (issue 36: protocol <-> tools / structured was an import cycle)."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}
        self.type = type_ or {
            400: "BadRequestError",
            401: "AuthenticationError",
            404: "NotFoundError",
            429: "RateLimitError",
            503: "ServiceUnavailableError",
        }.get(status, "BadRequestError" if status < 500 else "InternalServerError")
        self.code = code if code is not None else status

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)

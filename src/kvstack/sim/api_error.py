"""``APIError``: an error answer in vLLM's ``ErrorResponse`` shape, with its status."""

from __future__ import annotations

from typing import Any

__all__ = ["APIError", "bad_request"]


class APIError(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "BadRequestError", param)

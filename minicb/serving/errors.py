"""The error every refused request gets: OpenAI's shape, with the field at fault and the fix.

    {"error": {"message": ..., "type": "invalid_request_error", "param": "top_p", "code": null}}
"""

from __future__ import annotations


class APIError(Exception):
    """An error the client caused (or overload); becomes a JSON error body with `status`."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, error_type: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status
        self.error_type, self.headers = error_type, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code}}

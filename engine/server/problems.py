"""RFC 9457 problem documents: every error the API returns before a stream starts.

Clients branch on the HTTP status and ``code`` only, so each code has exactly one status, fixed here.
"""

from __future__ import annotations

import json
from typing import Final

from starlette.responses import Response

PROBLEM_MEDIA_TYPE: Final = "application/problem+json"

STATUS_BY_CODE: Final[dict[str, int]] = {
    "malformed_json": 400,
    "invalid_request_id": 400,
    "request_not_found": 404,
    "request_id_in_use": 409,
    "request_cancelled": 409,
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "invalid_text": 422,
    "invalid_voice_description": 422,
    "unsupported_language": 422,
    "invalid_max_duration": 422,
    "invalid_seed": 422,
    "invalid_sampling": 422,
    "unsupported_response_format": 422,
    "unsupported_model": 422,
    "unsupported_speed": 422,
    "invalid_request": 422,
    "capacity_exhausted": 429,
    "internal_error": 500,
    "buffer_limit_exceeded": 500,
    "backend_unavailable": 503,
    "server_shutting_down": 503,
    "native_retirement_timeout": 503,
}

_TITLES: Final[dict[int, str]] = {
    400: "Bad Request",
    404: "Not Found",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Problem(Exception):
    """An error with a stable code; raised anywhere in a handler, rendered once by the app."""

    def __init__(self, code: str, detail: str, request_id: str | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.request_id = request_id

    @property
    def status(self) -> int:
        return STATUS_BY_CODE[self.code]

    def to_response(self) -> Response:
        body: dict[str, object] = {
            "type": f"urn:qwen3-tts-native:problem:{self.code}",
            "title": _TITLES[self.status],
            "status": self.status,
            "code": self.code,
            "detail": self.detail,
        }
        headers: dict[str, str] = {"cache-control": "no-store"}
        if self.request_id is not None:
            body["request_id"] = self.request_id
            headers["x-request-id"] = self.request_id
        if self.status == 429:
            headers["retry-after"] = "1"
        return Response(
            json.dumps(body, separators=(",", ":")).encode(),
            status_code=self.status,
            headers=headers,
            media_type=PROBLEM_MEDIA_TYPE,
        )

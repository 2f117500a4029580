"""``GET /admin/requests/{id}``: one engine request's prompt and output text (``--expose-text``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

RequestTextState = Literal["running", "finished"]


class RequestText(BaseModel):
    """What the server keeps of one engine sequence's text (control/requests_text.py)."""

    id: str = Field(description="The engine sequence's id, as in /admin/state's requests.")
    request_id: str = Field(
        description="The engine request it answers (a fork of n > 1 shares its first's)."
    )
    state: RequestTextState = Field(
        description="running: admitted, not finished (it may still wait in the queue); "
        "finished: one of the last finished ones kept."
    )
    prompt: str = Field(
        description="The prompt: a completion's text (token ids decoded), a chat's messages "
        "as the chat template rendered them."
    )
    prompt_chars: int = Field(description="Characters of the whole prompt.")
    prompt_truncated: bool = Field(description="Only the first max_chars are kept.")
    output: str = Field(description="The text generated so far, as it was streamed.")
    output_chars: int = Field(description="Characters generated so far.")
    output_truncated: bool = Field(description="Only the first max_chars are kept.")
    max_chars: int = Field(description="Characters kept of a prompt and of an output each.")
    finish_reason: str | None = Field(
        None, description="Why it finished (stop, length, abort, error...); null while running."
    )
    started_at: datetime = Field(description="When the engine admitted it.")
    finished_at: datetime | None = None

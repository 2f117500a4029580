"""A checkpoint's chat template, found and rendered the way ``transformers`` does.

Where the template lives (``find_template``), first found wins, as transformers reads them:
``chat_template.jinja`` beside the tokenizer, the ``chat_template`` of ``chat_template.json``
(the processors' older file), then ``tokenizer_config.json``'s ``chat_template`` (a string, or
a list of ``{"name", "template"}`` of which the ``default`` one is used). A GGUF checkpoint
(a ``.gguf`` path) carries its own: ``tokenizer.chat_template`` and its special tokens
(``engine.gguf_tokenizer``).

Rendering follows ``transformers.utils.chat_template_utils``: an immutable sandboxed jinja2
environment with ``trim_blocks`` and ``lstrip_blocks``, ``loopcontrols``, a ``tojson`` filter
that keeps non-ASCII characters and does not escape HTML, the ``raise_exception`` and
``strftime_now`` globals, and ``dict``/``namespace`` that cannot reach Python internals. The
template sees ``messages``, ``add_generation_prompt``, ``tools`` (the request's, or None),
``documents`` (None) and the tokenizer's named special tokens (``bos_token``, ``eos_token``,
...). Templates come from checkpoints downloaded from anywhere: they are untrusted code, hence
the sandbox.

Lives in control/ so that jinja2 stays out of the engine's dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NoReturn

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import Namespace

from engine.model.formats import is_gguf

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_JSON = "chat_template.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The named special tokens a template sees as variables (transformers' ``special_tokens_map``)."""


RenderFailure = Literal[
    "refused",
    "does_not_compile",
    "loader",
    "range",
    "recursion",
    "memory",
    "output_too_large",
    "failed",
    "timeout",
    "worker_died",
    "missing",
]
"""Why a conversation has no prompt: the template refused it (``raise_exception``, the
sandbox) or does not compile; ``{% include %}``/``{% import %}``/``{% extends %}`` (no other
template can be loaded); a ``range`` past the sandbox's bound; too deep a recursion; out of
memory; more output than allowed; any other exception; too long a render or a worker that
died (``control.chat.render``); no template at all."""


class ChatTemplateError(ValueError):
    """The template refused the conversation or failed while rendering (``cause``); for
    ``refused`` the message is the template's own, otherwise it names the cause."""

    def __init__(self, message: str, cause: RenderFailure = "refused") -> None:
        super().__init__(message)
        self.cause: RenderFailure = cause


class _NoLoader(jinja2.BaseLoader):
    """``{% include %}``, ``{% import %}`` and ``{% extends %}`` find nothing: a checkpoint's
    template is one text, and may read no file."""

    def get_source(self, environment: jinja2.Environment, template: str) -> NoReturn:
        raise ChatTemplateError(
            f"the chat_template includes, imports or extends {template!r}: a chat template "
            "cannot load other templates",
            "loader",
        )


def _range(*args: int) -> range:
    """The sandbox's ``range``, failing as a template error past its bound."""
    try:
        return safe_range(*args)
    except OverflowError:
        raise ChatTemplateError(
            f"the chat_template asked for a range of more than {MAX_RANGE} items (the "
            "sandbox's bound)",
            "range",
        ) from None


# Any in this module: a template's context (messages, tools, what a template passes to the
# helpers it is given), arbitrary JSON and jinja values by design.
class _Namespace(Namespace):
    """jinja's ``namespace`` that refuses attribute names starting with ``_``."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _Dict:
    """``dict(...)`` and ``dict.fromkeys(...)`` in a template, without the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], loader=_NoLoader()
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        range=_range,
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_Dict(),
        namespace=_Namespace,
    )
    return env.from_string(source)


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    """The file it was read from."""

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        max_output: int | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text of a conversation (messages as plain dicts: ``role``, ``content``)
        and the ``tools`` (OpenAI's ``{"type": "function", "function"}`` dicts, as
        transformers passes them); rendering stops once it has more than ``max_output``
        characters. Raises
        ``ChatTemplateError`` when the template refuses the conversation or fails in any way.

        This runs the template in the calling thread, which nothing can stop: the server
        renders in ``control.chat.render``'s worker processes instead."""
        try:
            pieces = _compile(self.source).generate(
                **self.special_tokens,
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
            return "".join(pieces if max_output is None else _bounded(pieces, max_output))
        except ChatTemplateError:
            raise
        except Exception as exc:
            raise _failure(exc) from exc


def takes_tools(source: str) -> bool:
    """Whether a template's source reads the ``tools`` variable (has a tools branch, as
    Qwen's and Llama 3.1's have): parsed, never run; a source that does not parse has none."""
    try:
        return "tools" in meta.find_undeclared_variables(
            jinja2.Environment(extensions=[loopcontrols]).parse(source)
        )
    except Exception:  # a syntax error, or too deep a nesting for the parser
        return False


def _bounded(pieces: Iterator[str], max_output: int) -> Iterator[str]:
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > max_output:
            raise ChatTemplateError(
                f"the chat_template rendered more than max_chat_template_output "
                f"({max_output} characters) and was stopped",
                "output_too_large",
            )
        yield piece


def _failure(exc: Exception) -> ChatTemplateError:
    """An exception out of rendering, named: the template's own refusals keep their text."""
    if isinstance(exc, jinja2.exceptions.TemplateSyntaxError):
        return ChatTemplateError(f"the chat template does not compile: {exc}", "does_not_compile")
    if isinstance(exc, jinja2.exceptions.TemplateError):
        return ChatTemplateError(str(exc) or type(exc).__name__)
    if isinstance(exc, RecursionError):
        return ChatTemplateError("the chat_template recursed too deep", "recursion")
    if isinstance(exc, MemoryError):
        return ChatTemplateError("the chat_template ran out of memory", "memory")
    return ChatTemplateError(f"the chat_template failed: {type(exc).__name__}: {exc}", "failed")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    content = value.get("content") if isinstance(value, dict) else None
    return content if isinstance(content, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _named(templates: Any) -> str | None:
    """``tokenizer_config.json``'s ``chat_template``: a string, or named ones (``default``)."""
    if isinstance(templates, str):
        return templates
    if isinstance(templates, list):
        by_name = {t.get("name"): t.get("template") for t in templates if isinstance(t, dict)}
        default = by_name.get("default")
        return default if isinstance(default, str) else None
    return None


def find_template(model_dir: Path) -> tuple[str, Path] | None:
    """The template's text and the file holding it, or None when the checkpoint has none."""
    if is_gguf(model_dir):
        from engine.gguf_tokenizer import gguf_tokenizer  # torch and gguf: only for a GGUF file

        source = gguf_tokenizer(model_dir).chat_template
        return None if source is None else (source, model_dir)
    if (path := model_dir / TEMPLATE_FILE).is_file():
        return path.read_text(encoding="utf-8"), path
    path = model_dir / TEMPLATE_JSON
    if (source := _named(_read_json(path).get("chat_template"))) is not None:
        return source, path
    path = model_dir / TOKENIZER_CONFIG
    if (source := _named(_read_json(path).get("chat_template"))) is not None:
        return source, path
    return None


@lru_cache(maxsize=4)
def load_chat_template(model_dir: Path) -> ChatTemplate | None:
    """The checkpoint's template with its special tokens, read once per folder; None without
    one. A template that does not compile raises ``ChatTemplateError``."""
    found = find_template(model_dir)
    if found is None:
        return None
    source, path = found
    if is_gguf(model_dir):
        from engine.gguf_tokenizer import gguf_tokenizer  # torch and gguf: only for a GGUF file

        tokens = dict(gguf_tokenizer(model_dir).special_tokens)
    else:
        config = _read_json(model_dir / TOKENIZER_CONFIG)
        tokens = {name: text for name in SPECIAL_TOKENS if (text := _token_text(config.get(name)))}
    try:
        _compile(source)
    except Exception as exc:  # a syntax error, or a parser that recursed too deep
        raise ChatTemplateError(
            f"{path.name}: the chat template does not compile: {type(exc).__name__}: {exc}",
            "does_not_compile",
        ) from exc
    return ChatTemplate(source, tokens, path)

"""``specgen chat`` (and ``run -cnv``, or ``run`` with no prompt on a terminal): a conversation.

Each turn renders the whole conversation with the target's chat template and generates with the
KV prefix of the turn before reused (as ``serve`` does), so a turn costs only its new tokens.
Ctrl-C stops the answer and not the chat (the next turn then reads its prompt afresh); Ctrl-D
or ``/bye`` leaves. Lines are read with ``readline`` (editing, and a history kept across
sessions in ``$SPECGEN_HOME/chat_history``); a message of several lines goes between
``\"\"\"`` as in Ollama. Slash commands in Ollama's spirit: ``/help``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.cli.output import out
from specgen.core.penalties import REQUEST_FIELDS, Penalties, penalties_from
from specgen.errors import UsageError, describe

if TYPE_CHECKING:
    from specgen.api import Settings, Specgen

PROMPT, MORE = ">>> ", "... "
FENCE = '"""'
HISTORY_LINES = 1000
HELP = """\
/set temperature|top-k|top-p|min-p|seed|max-tokens VALUE   change a setting (seed -1: none)
/set repeat-penalty|frequency-penalty|presence-penalty|repeat-last-n VALUE   llama.cpp's
/set system TEXT   /system TEXT   the system message (empty: none)
/show              the settings and the conversation's length
/clear             forget the conversation (the system message stays)
/save FILE         write the conversation as JSON; /load FILE reads one back
/bye               leave (Ctrl-D too); Ctrl-C stops an answer
\"\"\" ... \"\"\"        a message of several lines"""
SAMPLING_NAMES = {
    "temperature": "temperature",
    "top-k": "top_k",
    "top-p": "top_p",
    "min-p": "min_p",
}


@dataclass
class Conversation:
    """What a chat holds between turns: its messages, the system message and the settings."""

    settings: Settings
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)

    def command(self, line: str) -> bool:
        """Obey one slash command; False when it ends the chat. A wrong one raises
        ``UsageError`` with the line to show (the chat goes on)."""
        name, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if name in ("/bye", "/exit", "/quit"):
            return False
        if name in ("/help", "/?"):
            out.note(HELP, style=None)
        elif name == "/clear":
            self.messages.clear()
            out.note("the conversation is cleared")
        elif name == "/system":
            self.set("system", rest)
        elif name == "/set":
            key, _, value = rest.partition(" ")
            self.set(key, value.strip())
        elif name == "/show":
            out.note(self.show(), style=None)
        elif name == "/save":
            self.save(Path(_argument(rest, "/save FILE")))
        elif name == "/load":
            self.load(Path(_argument(rest, "/load FILE")))
        else:
            raise UsageError(f"unknown command {name}: /help lists them")
        return True

    def set(self, key: str, value: str) -> None:
        """``/set KEY VALUE``: a sampling setting, the seed, the token limit or the system."""
        from specgen.core.sampling import SamplingParams

        if key == "system":
            self.system = value or None
            out.note("the system message is set" if value else "no system message")
            return
        if not key or not value:
            raise UsageError("/set needs a name and a value, as /set temperature 0.7")
        try:
            if key in SAMPLING_NAMES:
                number: Any = int(value) if key == "top-k" else float(value)
                sampling = replace(self.settings.sampling, **{SAMPLING_NAMES[key]: number})
                SamplingParams(
                    sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p
                )  # checks the ranges
                self.settings = replace(self.settings, sampling=sampling)
            elif key.replace("-", "_") in REQUEST_FIELDS:
                name = key.replace("-", "_")
                given = int(value) if name == "repeat_last_n" else float(value)
                penalties = penalties_from({name: given}, self.settings.penalties)
                self.settings = replace(self.settings, penalties=penalties)
            elif key == "seed":
                seed = int(value)
                self.settings = replace(self.settings, seed=None if seed < 0 else seed)
            elif key == "max-tokens":
                from specgen.cli.options import max_tokens_of

                self.settings = replace(self.settings, max_tokens=max_tokens_of(int(value)))
            else:
                raise UsageError(
                    f"/set {key}: not a setting (temperature, top-k, top-p, min-p, seed, "
                    "max-tokens, repeat-penalty, frequency-penalty, presence-penalty, "
                    "repeat-last-n, system)"
                )
        except ValueError as err:
            raise UsageError(f"/set {key} {value}: {err}") from None
        out.note(f"{key} = {value}")

    def show(self) -> str:
        s, sampling = self.settings, self.settings.sampling
        penalties = s.penalties or Penalties()
        return (
            f"temperature {sampling.temperature:g}  top-k {sampling.top_k}  "
            f"top-p {sampling.top_p:g}  min-p {sampling.min_p:g}  "
            f"seed {'none' if s.seed is None else s.seed}  max-tokens {s.max_tokens}\n"
            f"repeat-penalty {penalties.repeat:g}  frequency-penalty {penalties.frequency:g}  "
            f"presence-penalty {penalties.presence:g}  repeat-last-n {penalties.last_n}\n"
            f"system: {self.system if self.system else '(none)'}\n"
            f"{len(self.messages)} messages"
        )

    def save(self, path: Path) -> None:
        document = {"system": self.system, "messages": self.messages}
        try:
            path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        except OSError as err:
            raise UsageError(f"/save {path}: {err.strerror or err}") from None
        out.note(f"saved {len(self.messages)} messages to {path}")

    def load(self, path: Path) -> None:
        try:
            document: Any = json.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise UsageError(f"/load {path}: {err.strerror or err}") from None
        except ValueError as err:
            raise UsageError(f"/load {path}: not JSON ({err})") from None
        if isinstance(document, list):  # a bare list of messages, as the API takes
            document = {"messages": document}
        messages = document.get("messages") if isinstance(document, dict) else None
        if not isinstance(messages, list) or not all(
            isinstance(m, dict)
            and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise UsageError(f"/load {path}: give what /save writes (messages of role and content)")
        system = document.get("system")
        self.system = system if isinstance(system, str) and system else self.system
        self.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        out.note(f"loaded {len(self.messages)} messages from {path}")


def _argument(rest: str, usage: str) -> str:
    if not rest:
        raise UsageError(f"give a file: {usage}")
    return rest


def converse(sg: Specgen, settings: Settings, system: str | None, show_stats: bool) -> None:
    """The chat loop, until ``/bye`` or Ctrl-D."""
    from specgen.cli.live import StreamView
    from specgen.session.generate import Result

    if sg.pair.target.chat_template() is None:
        raise UsageError(
            f"{sg.pair.target.path.name} has no chat template, so it cannot chat: "
            "give `specgen run` a prompt to continue instead"
        )
    chat = Conversation(settings, system)
    read = _reader()
    out.note(f"chatting with {sg.name}: /help for commands, /bye or Ctrl-D to leave")
    reuse = True
    while True:
        try:
            text = read()
        except EOFError:
            break
        except KeyboardInterrupt:
            sys.stderr.write("\n")
            out.note("(Ctrl-D or /bye leaves the chat)")
            continue
        if not text.strip():
            continue
        if text.lstrip().startswith("/"):
            try:
                if not chat.command(text):
                    break
            except UsageError as err:
                out.error(str(err))
            continue
        chat.messages.append({"role": "user", "content": text})
        stats = sg.new_stats(chat.settings)
        pieces: list[str] = []
        try:
            with StreamView(stats, show_stats=show_stats) as view:
                try:
                    for item in sg.stream_events(
                        chat.messages,
                        chat.settings,
                        system=chat.system,
                        reuse_prefix=reuse,
                        chat=True,
                        stats=stats,
                    ):
                        if isinstance(item, Result):
                            break
                        pieces.append(item.text)
                        view.write(item.text)
                    reuse = True
                except KeyboardInterrupt:  # the answer stops; the chat goes on
                    stats.finish("interrupted")
                    reuse = False
        except Exception as err:  # one a user can cause: one line, and the turn is undone
            message = describe(err)
            if message is None:
                raise
            out.error(message)
            chat.messages.pop()
            reuse = False
            continue
        answer = "".join(pieces)
        if answer and not answer.endswith("\n") and not sys.stdout.isatty():
            sys.stdout.write("\n")  # a transcript on a file or pipe: one answer a paragraph
            sys.stdout.flush()
        chat.messages.append({"role": "assistant", "content": answer})


def _reader() -> Callable[[], str]:
    """A function that reads one message (``readline`` editing and history on a terminal)."""
    interactive = sys.stdin.isatty()
    if interactive:
        _history()

    def line(prompt: str) -> str:
        if interactive and sys.stdout.isatty():
            return input(prompt)  # readline draws the prompt where it edits the line
        if interactive:  # stdout is a file: the prompt must not go into it
            sys.stderr.write(prompt)
            sys.stderr.flush()
        return input()

    def read() -> str:
        first = line(PROMPT)
        if not first.lstrip().startswith(FENCE):
            return first
        body = first.lstrip()[len(FENCE) :]
        lines = []
        while not body.rstrip().endswith(FENCE):
            lines.append(body)
            body = line(MORE)
        lines.append(body.rstrip()[: -len(FENCE)])
        return "\n".join(lines).strip("\n")

    return read


def _history() -> None:
    """Lines typed before, across sessions (what readline's up arrow shows)."""
    try:
        import readline
    except ImportError:  # no readline (Windows): lines are read without history
        return
    import atexit

    from specgen.models.registry import user_config_dir

    path = user_config_dir() / "chat_history"
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(HISTORY_LINES)

    def save() -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass

    atexit.register(save)

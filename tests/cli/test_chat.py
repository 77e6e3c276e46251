"""``specgen chat`` as a person meets it: in a real pseudo-terminal (pexpect), on the fakes.

The fakes answer the rendered conversation deterministically at temperature 0, so a turn's text
is checked against ``specgen run`` with the same messages; Ctrl-C is a real SIGINT from the
terminal (pexpect's ``sendintr``), and the history is readline's file in ``$SPECGEN_HOME``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pexpect
import pytest

from tests.conftest import FakePair
from tests.invoke import SPECGEN, process_env, specgen_process

TIMEOUT = 60


def spawn(*args: str) -> pexpect.spawn:
    env = process_env({"TERM": "dumb", "COLUMNS": "100", "LINES": "30"}, fakes=True)
    child = pexpect.spawn(
        SPECGEN[0], [*SPECGEN[1:], *args], env=env, encoding="utf-8", timeout=TIMEOUT
    )
    child.setwinsize(30, 100)
    return child


def leave(child: pexpect.spawn) -> int:
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, child.signalstatus
    return child.exitstatus


@pytest.fixture
def chat_args(fake_pair: FakePair) -> list[str]:
    return fake_pair.args("--temperature", "0", "-n", "12")


def test_a_conversation_in_a_terminal(chat_args: list[str], tmp_path: Path) -> None:
    child = spawn("chat", *chat_args)
    child.expect("/bye or Ctrl-D to leave")
    child.expect_exact(">>> ")
    child.sendline("Hello there")
    child.expect("stop: max_tokens")  # the turn's statistics, after its text
    child.expect_exact(">>> ")
    child.sendline("/set temperature 0.5")
    child.expect("temperature = 0.5")
    child.sendline("/set repeat-penalty 1.3")
    child.expect("repeat-penalty = 1.3")
    child.sendline("/set presence-penalty 5")
    child.expect("error: /set presence-penalty 5: presence_penalty must be from -2 to 2")
    child.sendline("/show")
    child.expect("repeat-penalty 1.3  frequency-penalty 0  presence-penalty 0  repeat-last-n 64")
    child.sendline("/set nonsense 1")
    child.expect("error: /set nonsense: not a setting")  # one line, and the chat goes on
    child.expect_exact(">>> ")
    child.sendline('"""A message')
    child.expect_exact("... ")
    child.sendline('on two lines"""')
    child.expect("stop: ")
    saved = tmp_path / "talk.json"
    child.sendline(f"/save {saved}")
    child.expect("saved 4 messages")
    assert leave(child) == 0
    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2
    assert messages[0]["content"] == "Hello there"
    assert messages[2]["content"] == "A message\non two lines"
    assert all(m["content"] for m in messages[1::2])


def test_each_turn_answers_what_run_answers_for_the_conversation(
    chat_args: list[str], tmp_path: Path
) -> None:
    """The second turn, with the first turn's prefix reused, gives the text a fresh run of the
    whole conversation gives: the reuse changes the cost, never the answer."""
    saved = tmp_path / "two.json"
    chat = specgen_process("chat", *chat_args, input=f"Hi\nAnd then?\n/save {saved}\n", fakes=True)
    assert chat.returncode == 0, chat.stderr
    messages = json.loads(saved.read_text())["messages"]
    batch = tmp_path / "one.jsonl"
    batch.write_text(json.dumps({"messages": messages[:3]}) + "\n")
    again = specgen_process("run", "-f", str(batch), *chat_args, fakes=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["text"] == messages[3]["content"]
    # stdout is the transcript: the two answers, each ending its own line
    answers = [m["content"] for m in messages[1::2]]
    assert chat.stdout == "".join(a if a.endswith("\n") else a + "\n" for a in answers)


def test_ctrl_c_stops_the_answer_not_the_chat(fake_pair: FakePair) -> None:
    child = spawn("chat", *fake_pair.busy(0.01).args("--temperature", "0", "-n", "-1"))
    child.expect_exact(">>> ")
    child.sendline("Tell me a very long story")
    child.expect_exact("Tell me a very long story")  # the terminal's echo of the line
    child.expect("tok/s")  # then the live statistics: the answer is streaming
    child.sendintr()
    child.expect("stop: interrupted")
    child.expect_exact(">>> ")
    child.sendintr()  # at the prompt, Ctrl-C says how to leave
    child.expect("Ctrl-D or /bye leaves")
    child.sendline("/show")
    child.expect("2 messages")  # the cut answer stays in the conversation
    child.sendeof()  # Ctrl-D leaves
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_history_across_sessions(chat_args: list[str]) -> None:
    child = spawn("chat", *chat_args)
    child.expect_exact(">>> ")
    child.sendline("Remember this line")
    child.expect("stop: ")
    assert leave(child) == 0
    history = Path(os.environ["SPECGEN_HOME"]) / "chat_history"
    assert "Remember this line" in history.read_text()
    child = spawn("chat", *chat_args)
    child.expect_exact(">>> ")
    child.send("\x1b[A")  # the up arrow brings the last session's lines back
    child.send("\x1b[A")
    child.expect("Remember this line")
    child.sendline("")
    child.expect("stop: ")
    assert leave(child) == 0


def test_run_with_no_prompt_on_a_terminal_opens_the_chat(chat_args: list[str]) -> None:
    for args in (["run", *chat_args], ["run", "-cnv", *chat_args]):
        child = spawn(*args)
        child.expect("/bye or Ctrl-D to leave")
        child.expect_exact(">>> ")
        assert leave(child) == 0


def test_a_model_without_a_chat_template_is_one_line(tmp_path: Path) -> None:
    from tests.fakes import write_fake

    bare = write_fake(tmp_path / "bare.gguf", chat_template=None)
    done = specgen_process("chat", "--target", str(bare), input="Hi\n", fakes=True)
    assert done.returncode == 2 and done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: bare.gguf has no chat template"), done.stderr
    assert "Traceback" not in done.stderr


def test_chat_refuses_a_prompt_and_batch_options(chat_args: list[str]) -> None:
    done = specgen_process("run", "-cnv", "Hi", *chat_args, fakes=True)
    assert done.returncode == 2 and "a chat takes its messages from the terminal" in done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="readline and ptys are POSIX")
def test_load_gives_the_conversation_back(chat_args: list[str], tmp_path: Path) -> None:
    saved = tmp_path / "in.json"
    saved.write_text(
        json.dumps({"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]})
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [{"role": "robot"}]}')
    done = specgen_process(
        "chat", *chat_args, input=f"/load {saved}\n/load {bad}\n/show\n", fakes=True
    )
    assert done.returncode == 0, done.stderr
    assert "loaded 1 messages" in done.stderr and "system: Be brief." in done.stderr
    assert "error: /load" in done.stderr and "1 messages" in done.stderr

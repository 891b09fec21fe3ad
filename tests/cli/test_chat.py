"""fdpp generate -cnv as a person uses it: driven through a pseudo-terminal (pexpect), the default
model on the CPU, greedy. The rendered prompt of each turn is read from --verbose-prompt's output
(stderr shares the terminal), so the tests see what the model was given."""
import re
import subprocess
import time

import pexpect
import pytest

from conftest import FDPP, run

PROMPT = "\r\n> "  # the chat's input prompt (the terminal turns \n into \r\n)


def spawn(*args):
    child = pexpect.spawn(FDPP, ["generate", "--device", "cpu", "-cnv", "--temp", "0", "-co", "off", *args],
                          encoding="utf-8", timeout=120, dimensions=(60, 250))
    child.expect_exact(PROMPT)
    return child


def turn(child, message):
    """Sends a message; returns (rendered prompt, reply) once the reply's stats line is printed."""
    child.sendline(message)
    child.expect(r"--- prompt \(\d+ tokens\) ---\r\n")
    child.expect_exact("\r\n--- reply ---\r\n")
    prompt = child.before.replace("\r\n", "\n")
    assert prompt.endswith("<|im_start|>assistant\n"), prompt
    child.expect(r"\r\n\[ prompt: (\d+) tokens")
    reply = child.before.replace("\r\n", "\n")
    child.expect_exact(PROMPT)
    return prompt, reply


def finish(child):
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def test_two_turns_see_the_history_then_clear_and_overflow(default_model):
    child = spawn("--verbose-prompt", "-n", "12", "-c", "256", "-sys", "You are terse.")
    first_prompt, first_reply = turn(child, "My name is Zorblax.")
    assert "<|im_start|>system\nYou are terse.<|im_end|>" in first_prompt
    assert "My name is Zorblax." in first_prompt
    assert first_reply, "the model answered nothing"
    # The second turn is rendered over the whole conversation: the first message and the reply as
    # streamed, in order, before the new message.
    second_prompt, _ = turn(child, "What is my name?")
    i = second_prompt.index("<|im_start|>user\nMy name is Zorblax.<|im_end|>")
    j = second_prompt.index("<|im_start|>assistant\n" + first_reply, i)
    k = second_prompt.index("<|im_start|>user\nWhat is my name?<|im_end|>", j)
    assert i < j < k
    # /clear starts over (the system prompt stays).
    child.sendline("/clear")
    child.expect_exact("(the conversation is cleared)")
    child.expect_exact(PROMPT)
    third_prompt, _ = turn(child, "Hello.")
    assert "Zorblax" not in third_prompt and "You are terse." in third_prompt
    # A message that cannot fit the 256-token context: said, and the chat goes on.
    child.sendline("word " * 400)
    child.expect(r"this turn does not fit: the conversation is \d+ tokens \+ -n 12, the context 256")
    child.expect_exact(PROMPT)
    _, reply = turn(child, "Hi again.")
    child.sendline("/exit")
    assert finish(child) == 0


def interrupt_reply(child):
    """Waits until the reply streams, sends Ctrl-C; returns the rendered prompt and the tokens written."""
    child.expect(r"--- prompt \(\d+ tokens\) ---\r\n")
    child.expect_exact("\r\n--- reply ---\r\n")
    prompt = child.before.replace("\r\n", "\n")
    child.expect(r"\w+\W+\w+\W+\w+")  # the reply is streaming
    started = time.monotonic()
    child.sendintr()
    child.expect_exact("(interrupted)")
    assert time.monotonic() - started < 30
    child.expect(r"\[ prompt: \d+ tokens, [\d.]+ t/s \| reply: (\d+) tokens")
    written = int(child.match.group(1))
    child.expect_exact(PROMPT)
    return prompt, written


def test_ctrl_c_stops_a_long_reply_not_the_program(default_model):
    # --ignore-eos with no -n: each reply would run to the end of the 4096-token context.
    child = spawn("--verbose-prompt", "--ignore-eos")
    child.sendline("Tell me a long story about a dragon.")
    _, written = interrupt_reply(child)
    assert 3 <= written < 3000
    # Still running, with the interrupted reply in the history; the next reply is stopped too.
    child.sendline("Who is the hero?")
    prompt, _ = interrupt_reply(child)
    i = prompt.index("<|im_start|>user\nTell me a long story about a dragon.<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.index("<|im_start|>user\nWho is the hero?<|im_end|>") > i
    child.sendline("/exit")
    assert finish(child) == 0


@pytest.mark.parametrize("how", ["ctrl-c", "ctrl-d"])
def test_ctrl_c_or_ctrl_d_at_the_prompt_exits(default_model, how):
    child = spawn()
    if how == "ctrl-c":
        child.sendintr()
    else:
        child.sendeof()
    assert finish(child) == 0


def test_first_message_from_p_and_single_turn_without_a_terminal(default_model):
    r = run("generate", "--device", "cpu", "-cnv", "-st", "-p", "Say hi.", "-n", "4", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert "\n> Say hi.\n" in r.stdout
    # Multi-line input from a pipe: a line ending in \ continues on the next one.
    p = subprocess.run([FDPP, "generate", "--device", "cpu", "-cnv", "--verbose-prompt", "-n", "2", "--temp", "0"],
                       input="first line\\\nsecond line\n/exit\n", capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "<|im_start|>user\nfirst line\nsecond line<|im_end|>" in p.stderr


def test_chat_refusals_name_the_flag():
    r = run("generate", "-cnv", "--json")
    assert r.returncode == 2 and "--json: not with the chat" in r.stderr
    r = run("generate", "-p", "x", "-st")
    assert r.returncode == 2 and "--single-turn: only with the chat" in r.stderr
    r = run("generate", "-cnv", "--file", "x.jsonl")
    assert r.returncode == 2 and "excludes" in r.stderr.lower()


def gpu_or_skip():
    r = run("devices")
    if r.returncode != 0 or re.search(r"^cuda: (no |none|not compiled)", r.stdout + r.stderr, re.M) or "cuda" not in r.stdout:
        pytest.skip("no usable GPU")


def test_chat_on_the_gpu(default_model):
    """The same chat on the CUDA engine (ctest cli_llama_gpu, label gpu): the history reaches the
    second turn, Ctrl-C stops a long reply, /exit ends with 0."""
    gpu_or_skip()
    child = pexpect.spawn(FDPP, ["generate", "--device", "cuda", "-cnv", "--temp", "0", "-co", "off",
                                 "--verbose-prompt", "-n", "16"], encoding="utf-8", timeout=300, dimensions=(60, 250))
    child.expect_exact(PROMPT)
    _, first_reply = turn(child, "My name is Zorblax.")
    second_prompt, _ = turn(child, "What is my name?")
    assert "<|im_start|>user\nMy name is Zorblax.<|im_end|>\n<|im_start|>assistant\n" + first_reply in second_prompt
    child.sendline("/exit")
    assert finish(child) == 0
    child = pexpect.spawn(FDPP, ["generate", "--device", "cuda", "-cnv", "--temp", "0", "-co", "off",
                                 "--verbose-prompt", "--ignore-eos"], encoding="utf-8", timeout=300,
                          dimensions=(60, 250))
    child.expect_exact(PROMPT)
    child.sendline("Tell me a long story about a dragon.")
    _, written = interrupt_reply(child)
    assert written < 3000
    child.sendline("/exit")
    assert finish(child) == 0

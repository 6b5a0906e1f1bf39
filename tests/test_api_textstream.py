"""`TextStream`: deltas never show text that later changes, whatever the token boundaries."""

from __future__ import annotations

from clover_local.textstream import CONTENT, REASONING, TextStream

PIECES = ["I th", "ink", " so", "  \n", "</th", "ink>", "\n\n", "Par", "is is", " STO", "P here"]


def decode(ids: list[int]) -> str:
    """Tokens are indices into PIECES."""
    return "".join(PIECES[i] for i in ids)


def run(stream: TextStream, n: int, step: int = 1) -> list[tuple[str, str]]:
    deltas = []
    for i in range(step, n + 1, step):
        deltas += stream.feed(list(range(i)))
    return deltas + stream.feed(list(range(n)), final=True)


def test_reasoning_and_content_split_at_think_end_across_token_boundaries():
    for step in (1, 2, 3):
        s = TextStream(decode, reasoning=True)
        deltas = run(s, len(PIECES), step)
        assert s.text == {REASONING: "I think so", CONTENT: "Paris is STOP here"}
        assert "".join(d for f, d in deltas if f == REASONING) == "I think so"
        assert all(THINK not in d for _, d in deltas for THINK in ("</", "think>"))


def test_a_stop_string_split_over_tokens_is_never_shown():
    s = TextStream(decode, stop=["STOP"], reasoning=True)
    deltas = run(s, len(PIECES))
    assert s.stopped and s.text[CONTENT] == "Paris is "
    assert "".join(d for f, d in deltas if f == CONTENT) == "Paris is "
    assert all("ST" not in d for _, d in deltas)


def test_an_incomplete_character_waits_for_its_next_token():
    pieces = [b"caf", b"\xc3", b"\xa9!"]

    def utf8(ids: list[int]) -> str:
        return b"".join(pieces[i] for i in ids).decode("utf-8", "replace")

    s = TextStream(utf8)
    assert s.feed([0]) == [(CONTENT, "caf")]
    assert s.feed([0, 1]) == []  # "caf\ufffd": held back
    assert s.feed([0, 1, 2]) == [(CONTENT, "é!")]


def test_without_reasoning_everything_is_content():
    s = TextStream(decode)
    run(s, 4)
    assert s.text == {CONTENT: "I think so  \n", REASONING: ""}

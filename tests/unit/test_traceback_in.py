"""``http_fuzz.traceback_in``, which every hostile-input test relies on to say "no node
logged a traceback", must recognise every form a node writes one in."""

from __future__ import annotations

from pathlib import Path

import pytest

from otela.testing.http_fuzz import traceback_in

FOUND = {
    "plain": "x\nTraceback (most recent call last):\n  File ...\n",
    "group": "  + Exception Group Traceback (most recent call last):\n  |   File ...\n",
    "in a group": "    +------- 1 -------\n    | Traceback (most recent call last):\n",
    "rich box": "╭───────── Traceback (most recent call last) ─────────╮\n│ x │\n",
    "nested rich box": "│ │ ╭─────── Traceback (most recent call last) ───────╮ │ │\n",
}
NOT_FOUND = {
    "quoted in a refusal": "refused model 'Traceback (most recent call last):'\n",
    "clean": "INFO otela: announced SERVING (version 2)\n",
}


@pytest.mark.parametrize("text", FOUND.values(), ids=FOUND.keys())
def test_every_traceback_form_is_found(tmp_path: Path, text: str) -> None:
    (tmp_path / "node.log").write_text(text)
    assert traceback_in(tmp_path / "node.log")


@pytest.mark.parametrize("text", NOT_FOUND.values(), ids=NOT_FOUND.keys())
def test_the_words_alone_are_not_a_traceback(tmp_path: Path, text: str) -> None:
    (tmp_path / "node.log").write_text(text)
    assert not traceback_in(tmp_path / "node.log")

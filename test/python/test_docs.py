"""The python blocks of docs/capture.md run as written."""

import os
import re

import pytest

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "capture.md")
BLOCKS = re.findall(r"```python\n(.*?)```", open(DOC).read(), re.S)


def test_the_page_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"docs/capture.md[python block {index}]", "exec"), {})

"""The python blocks of the docs pages run as written."""

import os
import re

import pytest

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
BLOCKS = [block for page in ("capture.md", "sharding.md", "runtime.md", "training.md",
                                          "checkpoints.md")
          for block in re.findall(r"```python\n(.*?)```", open(os.path.join(DOCS, page)).read(), re.S)]


def test_the_page_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"docs[python block {index}]", "exec"), {})

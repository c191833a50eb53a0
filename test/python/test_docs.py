"""The python blocks of the docs pages and the README run as written."""

import os
import re
import textwrap

import pytest

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
PAGES = [os.path.join(DOCS, page) for page in ("capture.md", "sharding.md", "runtime.md",
                                                "training.md", "checkpoints.md", "serving.md")]
PAGES.append(os.path.join(DOCS, "..", "README.md"))
BLOCKS = [textwrap.dedent(block) for page in PAGES
          for block in re.findall(r"```python\n(.*?)```", open(page).read(), re.S)]


def test_the_page_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"docs[python block {index}]", "exec"), {})

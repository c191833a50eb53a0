"""examples/gpt_2x2.py (part of the README's first command) runs as shown."""

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gpt_2x2.py")


def test_gpt_2x2_example():
    out = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "none with storage" in out.stdout
    # Megatron on 4 layers: two all_reduces per layer over "tp", nothing else.
    assert out.stdout.count("all_reduce     over tp") == 8
    assert "total: 8 collectives" in out.stdout
    assert "func.func @forward(%arg0: tensor<4x32xi64>" in out.stdout
    assert "bitwise equal to eager construction: True" in out.stdout
    # The compiled binary on 4 ranks: the Megatron all_reduces moved bytes,
    # and the logits match eager (the example exits non-zero otherwise).
    assert "compiled and ran on 4 CPU ranks" in out.stdout
    assert "tdx: 4 ranks:" in out.stdout and " 0 bytes communicated" not in out.stdout

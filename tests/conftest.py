import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import synthetic_calibration  # noqa: E402


@pytest.fixture(scope="session")
def cal():
    return synthetic_calibration()

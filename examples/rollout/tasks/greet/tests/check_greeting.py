"""Hidden test of the `greet` task: answer.txt starts with a greeting. Exit 0: solved."""

import sys
from pathlib import Path

answer = Path("answer.txt")
sys.exit(0 if answer.is_file() and answer.read_text().strip().lower().startswith("hello") else 1)

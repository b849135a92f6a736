"""Hidden test of the `shout` task: answer.txt holds a greeting in capital letters only. Exit 0: solved."""

import sys
from pathlib import Path

answer = Path("answer.txt")
text = answer.read_text().strip() if answer.is_file() else ""
sys.exit(0 if text and text == text.upper() and "HELLO" in text else 1)

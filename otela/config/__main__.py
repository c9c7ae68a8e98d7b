"""``python -m otela.config --markdown``: print the settings table of docs/config.md."""

import sys

from otela.config.render import settings_markdown

if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m otela.config --markdown")
    print(settings_markdown())

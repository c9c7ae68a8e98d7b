"""``python -m otela.config --markdown``: print the settings table of docs/config.md;
``--update FILE`` rewrites the table inside FILE (between its marker comments)."""

import sys
from pathlib import Path

from otela.config.render import DOCS_BEGIN, DOCS_END, settings_markdown

if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        print(settings_markdown())
    elif len(sys.argv) == 3 and sys.argv[1] == "--update":
        page = Path(sys.argv[2])
        text = page.read_text()
        start, end = text.index(DOCS_BEGIN), text.index(DOCS_END) + len(DOCS_END)
        page.write_text(text[:start] + settings_markdown() + text[end:])
    else:
        sys.exit("usage: python -m otela.config --markdown | --update docs/config.md")

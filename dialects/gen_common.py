"""What the build's generators in dialects/ share."""


def write_if_changed(path, text):
    """Writes `text` to `path` unless it already holds it, so that nothing
    downstream of an unchanged output rebuilds."""
    try:
        if open(path).read() == text:
            return
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)

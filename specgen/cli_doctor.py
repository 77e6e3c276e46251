"""``specgen doctor``: placeholder replaced below."""
def doctor() -> None:
    """Check this machine."""

"""The ``specgen`` command line: one module per command (``run``, ``batch``, ``bench``,
``models``, ``doctor``, ``serve``, ``worker``), the options they share (``options``), what a
person sees (``output``, ``live``, ``bench_report``), and the app with its error table
(``app``). It only parses and renders: the work is the library's (``specgen.api``). Nothing
imports it.
"""

from specgen.cli.app import app, execute, main

__all__ = ["app", "execute", "main"]

"""``specgen bench`` as a library: sweep the ways of drafting on the user's own machine, measure
the target alone beside them, explain the figures, recommend one.

- ``sweep``: the interleaved runs of every prompt at K=0 and at each K or way of drafting;
- ``runner``: ``BenchSession``, the sweep on a loaded pair, one report per sampling setting;
- ``report``: the figures against the expected-tokens model, and the verdict;
- ``prompts``: the built-in prompts and prompt files;
- ``export``: JSON, CSV and a chart.

The CLI (``specgen.cli.bench``) only renders a report and shows progress; what bench found is
remembered for ``run`` and ``serve`` in ``specgen.session.memo``. Import from the modules
themselves: this package loads none of them, so the command line starts without the engine.
"""

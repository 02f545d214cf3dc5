"""`make demo` (``python -m demo``): the chart's own RayJob on this machine; the stand-ins it runs on
are the local kit's (localkit/). See demo/README.md."""

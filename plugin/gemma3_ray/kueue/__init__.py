"""kueue: Kueue's objects for the chart's RayJobs, through the Kubernetes API.

Owns: what Kueue counts for a rendered RayJob and the objects an admin makes for it (``objects``),
``kueue setup``'s plan and apply (``setup``), and Kueue as ``status`` and ``doctor`` see it: the
Workload of a queued RayJob, and whether the values' queue can admit their job (``check``).

May import: utils, config, kube.
"""

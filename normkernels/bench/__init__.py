"""The benchmark tools: the ``normkernels`` command line and what it times with.

* :mod:`normkernels.bench.cli`: ``normkernels bench | onnx | coldstart | info | warmup``
* :mod:`normkernels.bench.sweep`: ``normkernels bench --sweep`` (one operator at every size)
* :mod:`normkernels.bench.workloads`: the workload table, the suites, the timing harness
* :mod:`normkernels.bench.peers`: the implementations the bench compares with
* :mod:`normkernels.bench.model_timing`: whole ONNX models, cold start, the environment
* :mod:`normkernels.bench.report`: tables, progress lines and the agreement check

The tools import the operators (:mod:`normkernels.operators`) and the integrations;
nothing outside this package imports from it. Importing it imports nothing.
"""

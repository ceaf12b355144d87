"""JITServe: SLO-aware LLM serving (NSDI'26) as a Kubernetes operator, a router and vLLM engines."""

__version__ = "0.1.0"

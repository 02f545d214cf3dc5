"""gemma3-ray: the Helm plugin and GCP prerequisites for fine-tuning Gemma 3 with Ray on GKE."""

__version__ = "0.1.0"

"""gemma3-ray: the Helm plugin and GCP prerequisites for fine-tuning Gemma 3 with Ray on GKE.

Folders by what they talk to, lowest first; each imports only the folders its ``__init__`` names under
"May import" (tests/test_layering.py checks it): utils -> config -> kube, gke -> gcp -> kueue ->
release -> cli. plugin/README.md draws the map.
"""

__version__ = "0.1.0"

"""Deployment helpers: render the Helm chart under ``deploy/helm/kvstack`` for review
(``kvstack deploy render``) and know which metric names dashboards may use."""

"""The fleet of backends: who they are (discovery), their live state (health, ejection, load,
scraped metrics) and when one is saturated."""

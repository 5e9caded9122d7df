"""``kvstack demo``: two engines behind the router, the kvstack cache off and then on."""

"""Controller side: where requests are built and sent.  May import the host
side; the host side never imports this package."""

"""`prefixscope bench gateway`: a stub upstream, a load generator and the runner that ties them together."""

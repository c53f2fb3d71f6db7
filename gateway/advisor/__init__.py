"""The rule advisor: for a sample of each tenant's requests, off the request path, estimate what every rule or
setting the tenant does not have on would have gained, and record it with the request (`db.advice`).

`candidates` lists a tenant's candidates, `history` remembers its recent requests, `estimate` computes one sampled
request's counterfactuals (dry-run matches of the rewritten prompts against the same upstream), and `sampler` runs
the estimates in the background, bounded by a sample rate, a concurrency limit and a cap on waiting estimates.
"""

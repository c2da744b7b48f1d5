"""Best-fit's runtime (SPEC section 15): what a rule of bins reads, packs and bins again, one module a part.

The rule itself (its units, the placing of documents into bins) is planner's
(:mod:`planner.rules.bestfit`, :mod:`planner.rules.binned`); what reads data for it is here,
and everything asks the run's rule (:attr:`planner.rules.Rule.binning`), so a new rule of bins
is served unchanged:

- :mod:`plitzer.bestfit.counts`: the bins pass, each row group's bins at ``seq_len`` (the
  index frame's ``bins`` column the plan cuts by), cached, split between ranks, on Ray;
- :mod:`plitzer.bestfit.rows`: the packer's side, a window's bins packed as units by the concat
  packer and each then expanded into a padded row (:class:`~plitzer.bestfit.rows.Rows`, the read
  pool's ``Packing.rows``);
- :mod:`plitzer.bestfit.rebin`: a ``seq_len`` change, the plan binned at the new ``seq_len``
  and a window's lengths, what the run's ``Rebinner`` asks (:class:`~plitzer.bestfit.rebin.Rebin`).
"""

__all__: list[str] = []

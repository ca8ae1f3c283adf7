"""trainmap.dynamics.verdicts.compare: what a map answers and how sure: the permutation tests between methods
(compare), the label-free verdicts (paths, timecourse), convergence as censored time (survival),
the bootstrap (certainty), the stability curve (stability, stability_results), one label per
verdict (labels), rounds of seeds (adaptive) and the joint comparison of several methods (joint)."""

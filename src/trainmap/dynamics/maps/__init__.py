"""trainmap.dynamics.maps: the training map: the HMM (hmm/), the map's states and figure
(training_map), the detour regression (regression), synthetic runs with known states (synthetic)
and the analysis settings (settings)."""

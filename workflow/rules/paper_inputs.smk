# The paper's settings and the paper rules' input functions (rules in paper.smk).

#: The paper's settings the grid runs: setting -> its cells.
PAPER_GROUPS = grid.paper_groups(config)
PAPER_ANALYSES = ["authors", "trainmap"]


def setting_cells(wildcards):
    """The cells of one paper setting's group."""
    return PAPER_GROUPS[wildcards.setting]


def paper_maps(filename):
    """One file of every (setting, analysis) map, settings in config order."""
    return [
        f"{RESULTS}/paper/{setting}/{analysis}/{filename}"
        for setting in PAPER_GROUPS
        for analysis in PAPER_ANALYSES
    ]

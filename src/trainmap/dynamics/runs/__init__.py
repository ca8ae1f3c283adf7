"""trainmap.dynamics.runs: runs trainmap did not train: checkpoint directories and Hugging Face and
Lightning output directories (layouts), GPT-NeoX, Llama/OLMo and BERT by the paper's convention
(families), checkpoint suites in the Hugging Face cache (hub), a large checkpoint's metrics entry
by entry (bounded), the layouts' names (names) and the run sets (external)."""

"""The data that ships inside the package (services/mindmotor/assets/data/, provenance and licenses
in its README.md): a plain clone or an installed wheel can replay the trace and fit the emulator
without anything beside it.

- `AZURE_TRACE`: the conversation part of the Azure LLM inference trace 2023 (19,366 requests, one
  hour; CC-BY, Patel et al., Splitwise, ISCA 2024) — `mindmotor simulate`'s and the benchmarks' default.
- `VIDUR_DIR`: Vidur's measured Llama-2-7B step profiles of A100 and H100 (MIT; Agrawal et al.,
  MLSys 2024) — what benchmarks/fidelity.py fits and checks the cost model on.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "assets" / "data"
AZURE_TRACE = DATA_DIR / "azure_llm_conv_2023.csv"
VIDUR_DIR = DATA_DIR / "vidur"

"""Make a length profile (facts only, no text) from a ShareGPT file: `python -m workloads.length_profile F`.

The embedded `sharegpt` default was made this way; see `profiles/sharegpt.json` for its provenance.
"""

import argparse
import json

import numpy as np
import tiktoken

from workloads.tokenizer import OFFLINE_ENCODING


def prompt_length_quantiles(path: str) -> list[int]:
    encoding = tiktoken.get_encoding(OFFLINE_ENCODING)
    with open(path) as f:
        entries = json.load(f)
    lengths = [len(encoding.encode(e["conversations"][0]["value"], disallowed_special=())) for e in entries]
    return [int(round(q)) for q in np.percentile(lengths, np.arange(101))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", help="a ShareGPT JSON file")
    args = parser.parse_args()
    print(json.dumps({"dist": "quantiles", "values": prompt_length_quantiles(args.path)}))


if __name__ == "__main__":
    main()

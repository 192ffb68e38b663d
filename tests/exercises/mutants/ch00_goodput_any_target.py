WHAT = "goodput counts a request that met either target instead of every target"
CHAPTER = "00"
EDITS = [("        if slo_ttft is not None and (first is None or first > slo_ttft):\n"
          "            return False\n",
          "        if slo_ttft is not None and first is not None and first <= slo_ttft:\n"
          "            return True\n")]
CHECKS = "ch00 and (worked or sim_traces)"

WHAT = "percentile takes the nearest rank instead of interpolating"
CHAPTER = "00"
EDITS = [("    return data[below] + (data[above] - data[below]) * (rank - below)",
          "    return data[round(rank)]")]
CHECKS = "ch00 and (worked or percentiles_match_numpy)"

WHAT = "percentile takes the nearest rank instead of interpolating"
CHAPTER = "06"
EDITS = [("return data[below] + (data[above] - data[below]) * (rank - below)",
          "return data[round(rank)]")]
CHECKS = "ch06 and (worked or percentiles_match_numpy)"

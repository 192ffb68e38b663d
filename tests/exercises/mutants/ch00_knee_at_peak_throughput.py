WHAT = "the knee is read where throughput peaks instead of where goodput peaks"
CHAPTER = "00"
EDITS = [("key=lambda rate: (-goodput(traces[rate], slo_ttft, slo_tpot), rate)",
          "key=lambda rate: "
          "(-sum(r.output_tokens for r in traces[rate]) / duration(traces[rate]), rate)")]
CHECKS = "ch00 and sim_knee"

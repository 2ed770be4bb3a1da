/* mrun_help.h - the text of `mrun --help`, included once by mrun_main.c.
 *
 * Kept apart from the code because it is documentation: scripts/gen-cli-docs
 * turns it into docs/cli.md and the man page mrun(1) (tests/test_cli_docs.c
 * fails when they drift), so every option and the --json keys are listed
 * here.  The full --json schema is in the comment atop mrun_main.c. */
#ifndef MRUN_HELP_H
#define MRUN_HELP_H

static const char *g_usage =
    "usage: mrun MODEL INPUT [options]\n"
    "\n"
    "MODEL is a Hugging Face model directory (config.json + safetensors) or\n"
    "an mcompile artifact.\n"
    "\n"
    "Input (one of; token ids are decimal, separated by spaces or tabs):\n"
    "  --tokens \"1 2 3\"        one prompt of token ids (repeatable)\n"
    "  --tokens-file FILE      one prompt of ids per line; blank lines and\n"
    "                          lines starting with '#' are skipped\n"
    "  --prompt TEXT           one text prompt (repeatable; needs the\n"
    "                          tokenizer an artifact embeds, or a\n"
    "                          tokenizer.json beside the model)\n"
    "  --prompts-file FILE     one text prompt per line\n"
    "\n"
    "Generation (default mode):\n"
    "  --max-new-tokens N      tokens to generate per prompt (default 16)\n"
    "  --temperature T         0 = greedy (default)\n"
    "  --top-k K  --top-p P    sampling filters (default off)\n"
    "  --seed S                RNG seed (default 0); sequence i uses (S, i)\n"
    "  --stop \"ids\"            extra stop token ids\n"
    "  --ignore-eos            do not stop at the model's EOS ids\n"
    "\n"
    "Scoring (no generation):\n"
    "  --score-labels \"ids\"    log-prob of each label token after each prompt\n"
    "  --score-continuation \"ids\"  log-prob of each continuation token and\n"
    "                          their sum, after each prompt\n"
    "\n"
    "Plan and machine:\n"
    "  --threads N             worker threads (default: all CPUs)\n"
    "  --max-batch N --max-seq N --prefill-chunk N   session limits\n"
    "  --kv f32|f16|int8       KV cache type (default: the plan's, else f32)\n"
    "  --truncate left|right   fit over-long prompts instead of refusing\n"
    "\n"
    "Output:\n"
    "  --json                  one JSON object on stdout (below)\n"
    "  --metrics FILE          write Prometheus text metrics at the end of\n"
    "                          the run (also when it is refused)\n"
    "  --no-special            with a tokenizer: no BOS added, specials kept\n"
    "  -q, -v                  quieter (no timing) / more (plan and a memory\n"
    "                          summary on stderr)\n"
    "  -h, --help              this text\n"
    "\n"
    "Default output: one line per sequence with the generated ids (a tab and\n"
    "the decoded text follow when a tokenizer is present); timing (prefill\n"
    "and decode tokens/s) on stderr.  Exit: 0 ok, 1 failure, 2 usage.\n"
    "\n"
    "JSON: \"sequences\" [{ids, text, prompt_tokens, stop_reason}] or \"scores\";\n"
    "\"error\" when refused; prefill_tok_s, decode_tok_s, prefill_tokens,\n"
    "decode_tokens, prefill_seconds, decode_seconds, requests, refused,\n"
    "refused_by {plan, input, other}; memory in bytes: planned_bytes (plan:\n"
    "weights + arena + reserve), reserve_bytes, weights_mapped_bytes,\n"
    "arena_bytes, arena_high_water_bytes (measured arena peak),\n"
    "arena_touched_bytes (arena bytes really written), kv_bytes,\n"
    "peak_rss_bytes (process peak RSS), weight_bytes, params; plan\n"
    "(stored|overridden|runtime), threads, max_batch, max_seq, prefill_chunk.\n"
    "Always arena_touched_bytes <= arena_high_water_bytes <= arena_bytes <=\n"
    "planned_bytes.\n";

#endif /* MRUN_HELP_H */

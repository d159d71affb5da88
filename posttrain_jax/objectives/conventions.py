"""Where the library and verl / TRL differ on purpose, as data: docs/reference.md's
"Conventions" section is rendered from :data:`CONVENTIONS` and :data:`EDGE_CASES`
(posttrain_jax/docgen.py), and tests/objectives/test_peer_parity.py checks each convention
against outputs recorded from the peer's own functions.

A convention is a choice both sides make deliberately: the library keeps its default where it
is the better one, and the keywords named here switch a run to the peer's. An edge case is an
input where the peer's answer is an accident (a one-row group, an all-equal group, padding) and
the library's is the intended one; there is no switch for those.
"""

from typing import NamedTuple


class Convention(NamedTuple):
  """One deliberate difference. ``keywords``: the function keywords that select the peer's
  choice; ``setting``: the config that does it; ``consequence``: what a user sees."""

  pieces: str
  library: str
  peer: str
  keywords: tuple[str, ...]
  setting: str
  consequence: str


class EdgeCase(NamedTuple):
  pieces: str
  library: str
  peer: str


CONVENTIONS: tuple[Convention, ...] = (
  Convention(
    pieces="whitening: `reinforce_pp`, `reinforce_pp_baseline`, `reinforce_pp_token`, `gae`",
    library="(x - mean) / (std_n + eps), the population std",
    peer="verl: (x - mean) * rsqrt(var_{n-1} + 1e-8), the unbiased variance",
    keywords=("whitening",),
    setting='rl.advantage_kwargs={"whitening": "unbiased"}',
    consequence="advantages differ by sqrt(n/(n-1)): 1.07 for 8 rows, under 1.001 for a tile "
    "of 500 tokens; an effective learning-rate scale",
  ),
  Convention(
    pieces="REINFORCE++ batch statistics: `reinforce_pp`, `reinforce_pp_baseline`",
    library="every row weighs the same in the batch mean and std",
    peer="verl: the reward tiled over the row's tokens, so a row weighs by its length",
    keywords=("weigh",),
    setting='rl.advantage_kwargs={"weigh": "tokens"}',
    consequence="with ragged lengths verl's baseline leans to the long rows' rewards: a short "
    "correct answer gets a different advantage than a long one with the same reward",
  ),
  Convention(
    pieces="Dr.GRPO's constant normaliser: aggregation `seq_mean_token_sum_norm`",
    library="Σ ℓ / (B · L), the paper's eq. 3",
    peer="verl's `seq-mean-token-sum-norm`: Σ ℓ / L, no 1/B",
    keywords=("aggregation",),
    setting='rl.aggregation="token_sum_norm"',
    consequence="verl's loss and gradient are B times larger: a learning rate B times larger "
    "under SGD; under Adam nearly scale-free, but `grad_clip` clips B times sooner",
  ),
  Convention(
    pieces="dual clip: `ppo_clip` (and `hpo`, `a_hpo` through it)",
    library="off by default: PPO's clipped surrogate as in Schulman et al. 2017",
    peer="verl: always on, c = 3",
    keywords=("dual_clip",),
    setting='rl.policy_loss_kwargs={"dual_clip": 3.0}',
    consequence="a negative-advantage token with ratio > 3 adds -3A and no gradient under "
    "verl, -ρA with its gradient here",
  ),
  Convention(
    pieces="k3 output bound: KL estimators `k3`, `k3+`",
    library="unbounded (the estimate stays unbiased)",
    peer="verl: k3 clamped to [-10, 10]",
    keywords=("clamp",),
    setting='rl.kl_estimator_kwargs={"clamp": 10.0}',
    consequence="a token whose k3 exceeds 10 (log π_ref - log π ≳ 2.5) gets no KL gradient "
    "under verl, the full one here",
  ),
  Convention(
    pieces="the KL loss term's average over tokens (`rl.kl_coef` > 0, KL in the loss)",
    library="a token mean, whatever the policy loss's aggregation",
    peer="verl's actor and TRL: the policy loss's aggregation (TRL adds β·k3 per token)",
    keywords=("kl_aggregation",),
    setting='rl.kl_aggregation="policy"',
    consequence="under a per-sequence aggregation (`seq_mean_token_mean`, TRL's `grpo`) "
    "short responses' KL tokens weigh more in the peers, equally here",
  ),
  Convention(
    pieces="the KL loss term's importance weight (`rl.kl_coef` > 0, KL in the loss)",
    library="none: each sampled token's estimate counts as drawn from the current policy",
    peer="TRL (`use_bias_correction_kl`, on by default): each token's k3 times π/π_old "
    "(DeepSeek-V3.2), the ratio keeping its gradient",
    keywords=("kl_bias_correction",),
    setting="rl.kl_bias_correction=True",
    consequence="with several epochs or stale rollouts the library's KL penalty is measured "
    "on the old policy's samples; TRL's reweights them to the current policy",
  ),
  Convention(
    pieces="GPG's rescale α: advantage `gpg`",
    library="the paper's α = B / (B - M), M the rows in flat groups (no gradient)",
    peer="verl: α = B / (number of non-zero rewards)",
    keywords=("alpha",),
    setting='rl.advantage_kwargs={"alpha": "nonzero_rewards"}',
    consequence="with 0/1 rewards verl's α counts the correct answers, not the informative "
    "rows: a batch with few correct answers gets a large α even when most groups carry signal",
  ),
)

EDGE_CASES: tuple[EdgeCase, ...] = (
  EdgeCase(
    "one-row groups: `grpo`, `dr_grpo`, `rloo`, `opo`, `gpg`, `reinforce_pp_baseline`",
    "advantage 0: a lone rollout has no baseline",
    "verl uses a baseline of 0 (and a std of 1): the row keeps its raw reward",
  ),
  EdgeCase(
    "all-equal groups and batches (every whitening and group std)",
    "exactly 0, also with eps = 0",
    "verl whitens the float32 rounding error of the mean (e.g. three rewards of 7.3) by 1e4",
  ),
  EdgeCase(
    "padding after whitening: `gae`",
    "0 at masked positions",
    "verl leaves whitened values there (unused by its losses)",
  ),
  EdgeCase(
    "REINFORCE++ returns across holes in the mask: `reinforce_pp_token`",
    "the return to go runs across masked spans (a tool's output between two turns)",
    "verl resets the running return at every masked position, so earlier turns lose the final "
    "reward (right-padded masks give the same values)",
  ),
  EdgeCase(
    "straight-through KL: `k1+`, `k3+`",
    "k1's / k3's value with k2's gradient (verl's own definition)",
    "at b178a3c verl's `kl_penalty` raises NotImplementedError for the '+' names",
  ),
  EdgeCase(
    "Clip-Cov's selection: `clip_cov`",
    "the largest covariances within the band (the loss takes no random key)",
    "verl draws them uniformly at random within the band; the same set when the band holds "
    "at most max(⌊r N⌋, 1) tokens",
  ),
  EdgeCase(
    "GMPO's mean over rows: `gmpo`",
    "rows without tokens are not counted",
    "verl's `geo_mean` counts them in the mean",
  ),
  EdgeCase(
    "GSPO's bound on the sequence log-ratio (10): `gspo`",
    "value and gradient clamped: no gradient beyond the bound",
    "the same (verl's clamp)",
  ),
)

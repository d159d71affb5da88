import chex
import jax
import numpy as np
from absl.testing import parameterized

from posttrain_jax.objectives import auxiliary, group_baselines, ppo_family


def _echo_ref(entropy, rewards, group, valid, mask, step_end, num_groups, success, mode):
  """Numpy loop reference of the EchoClip mask."""
  rows, cols = mask.shape
  clip = np.zeros(mask.shape, np.float32)
  for p in range(num_groups):
    members = [b for b in range(rows) if group[b] == p and valid[b] > 0]
    if not members:
      continue
    r = [rewards[b] for b in members]
    if not (min(r) == max(r) and r[0] >= success):
      continue
    best = None  # (score, row, last token of the step)
    for b in members:  # ascending rows, then ascending steps: strict '>' keeps the first
      steps, cur = [], []
      for t in range(cols):
        if mask[b, t] == 0:
          continue
        cur.append(t)
        if step_end[b, t] > 0:
          steps.append(cur)
          cur = []
      if cur:
        steps.append(cur)
      for s in steps:
        vals = [float(entropy[b, t]) for t in s]
        score = np.mean(vals) if mode == "mean" else max(vals)
        if best is None or score > best[0]:
          best = (score, b, s[-1])
    if best is not None:
      clip[best[1], : best[2] + 1] = mask[best[1], : best[2] + 1]
  return clip


def _inputs(seed=0, rows=8, cols=10):
  rng = np.random.default_rng(seed)
  entropy = rng.uniform(0.0, 3.0, size=(rows, cols)).astype(np.float32)
  lengths = rng.integers(2, cols + 1, size=rows)
  mask = (np.arange(cols)[None] < lengths[:, None]).astype(np.float32)
  step_end = ((rng.random((rows, cols)) < 0.3) * mask).astype(np.float32)
  group = np.array([0, 0, 1, 1, 2, 2, 3, 3], np.int32)[:rows]
  rewards = np.array([1, 1, 1, 0, 1, 1, 0, 0], np.float32)[:rows]
  valid = np.ones(rows, np.float32)
  logprobs = np.log(rng.uniform(0.1, 0.9, size=(rows, cols))).astype(np.float32)
  return logprobs, entropy, rewards, group, valid, mask, step_end


class EchoClipMaskTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((0, "mean"), (1, "max"), (2, "mean"), (3, "max"))
  def test_matches_numpy(self, seed, mode):
    _, entropy, rewards, group, valid, mask, step_end = _inputs(seed)
    if seed >= 2:  # a padding row with a failed reward does not spoil group 1
      valid[3] = 0.0
      group = np.array([0, 0, 1, 1, 4, 4, 3, 3], np.int32)
    fn = self.variant(lambda *a: auxiliary.echo_clip_mask(*a, num_groups=6, step_score=mode))
    clip, m = fn(entropy, rewards, group, valid, mask, step_end)
    ref = _echo_ref(entropy, rewards, group, valid, mask, step_end, 6, 1.0, mode)
    np.testing.assert_array_equal(clip, ref)
    self.assertGreater(ref.sum(), 0)
    n_degenerate = 3 if seed >= 2 else 2
    np.testing.assert_allclose(m["echo/degenerate_frac"], n_degenerate / 4)
    np.testing.assert_allclose(m["echo/clip_tokens"], ref.sum())

  def test_clip_is_a_prefix_ending_at_a_step_boundary(self):
    for seed in range(6):
      _, entropy, rewards, group, valid, mask, step_end = _inputs(seed)
      clip = np.asarray(
        auxiliary.echo_clip_mask(entropy, rewards, group, valid, mask, step_end, num_groups=4)[0]
      )
      self.assertTrue(np.all(clip <= mask))
      selected = np.nonzero(clip.sum(-1))[0]
      self.assertEqual(len(selected), 2)  # one clip per degenerate group (0 and 2)
      self.assertEqual(set(group[selected].tolist()), {0, 2})
      for b in selected:
        n = int(clip[b].sum())
        np.testing.assert_array_equal(clip[b, :n], 1.0)  # contiguous from t = 0
        last = n - 1
        self.assertTrue(step_end[b, last] > 0 or last == mask[b].sum() - 1)

  def test_ablation_clips_ignore_the_entropy(self):
    """``first_step`` and ``full``: the group's first valid rollout, its first step or all of
    it, whatever the entropies."""
    _, entropy, rewards, group, valid, mask, step_end = _inputs(0)
    args = (rewards, group, valid, mask, step_end)
    for rule in ("first_step", "full"):
      clips = [
        np.asarray(auxiliary.echo_clip_mask(e, *args, num_groups=4, clip=rule)[0])
        for e in (entropy, entropy[::-1].copy())
      ]
      np.testing.assert_array_equal(clips[0], clips[1])  # entropy plays no part
      clip = clips[0]
      self.assertEqual(set(np.nonzero(clip.sum(-1))[0].tolist()), {0, 4})  # first row of 0, 2
      for b in (0, 4):
        real = int(mask[b].sum())
        if rule == "full":
          np.testing.assert_array_equal(clip[b], mask[b])
        else:
          ends = np.flatnonzero(step_end[b, :real] > 0)
          n = (ends[0] + 1) if len(ends) else real
          np.testing.assert_array_equal(clip[b, :n], 1.0)
          np.testing.assert_array_equal(clip[b, n:], 0.0)
    with self.assertRaisesRegex(ValueError, "unknown EchoClip rule"):
      auxiliary.echo_clip_mask(entropy, *args, num_groups=4, clip="random")

  def test_ties_are_deterministic(self):
    _, entropy, rewards, group, valid, mask, step_end = _inputs()
    entropy[1] = entropy[0]
    mask[1], step_end[1] = mask[0], step_end[0]
    args = (entropy, rewards, group, valid, mask, step_end)
    a = np.asarray(auxiliary.echo_clip_mask(*args, num_groups=4)[0])
    b = np.asarray(auxiliary.echo_clip_mask(*args, num_groups=4)[0])
    np.testing.assert_array_equal(a, b)
    self.assertGreater(a[0].sum(), 0)  # identical rollouts: the lower row index wins
    self.assertEqual(a[1].sum(), 0)

  def test_no_degenerate_group_no_clip(self):
    _, entropy, _, group, valid, mask, step_end = _inputs()
    rewards = np.array([1, 0, 1, 0, 0, 1, 0, 0], np.float32)
    clip, m = auxiliary.echo_clip_mask(entropy, rewards, group, valid, mask, step_end, num_groups=4)
    np.testing.assert_array_equal(clip, 0.0)
    np.testing.assert_allclose(m["echo/degenerate_frac"], 0.0)
    # All-failed groups (std 0 but r < success) are not degenerate in EchoRL's sense.
    clip, _ = auxiliary.echo_clip_mask(
      entropy, np.zeros(8, np.float32), group, valid, mask, step_end, num_groups=4
    )
    np.testing.assert_array_equal(clip, 0.0)

  def test_step_ends_from_tokens(self):
    tokens = np.array([[5, 10, 7, 11, 3], [10, 10, 2, 2, 2]], np.int32)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], np.float32)
    ends = auxiliary.step_ends_from_tokens(tokens, mask, delimiter_ids=(10, 11))
    np.testing.assert_array_equal(ends, [[0, 1, 0, 1, 0], [1, 1, 0, 0, 0]])


class EchoLossTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_value_and_gradient(self):
    logprobs, entropy, rewards, group, valid, mask, step_end = _inputs(1)
    coef = 0.3
    fn = lambda lp, h, r: auxiliary.echo_clip_loss(
      lp, h, r, group, valid, mask, step_end, num_groups=4, coef=coef
    )[0]
    clip = _echo_ref(entropy, rewards, group, valid, mask, step_end, 4, 1.0, "mean")
    value = self.variant(fn)(logprobs, entropy, rewards)
    np.testing.assert_allclose(value, -coef * (clip * logprobs).sum() / clip.sum(), rtol=1e-5)
    g_lp, g_h, g_r = jax.grad(fn, argnums=(0, 1, 2))(logprobs, entropy, rewards)
    np.testing.assert_allclose(g_lp, -coef * clip / clip.sum(), rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(g_h, 0.0)  # selection only
    np.testing.assert_array_equal(g_r, 0.0)

  def test_zero_when_nothing_selected_or_coef_zero(self):
    logprobs, entropy, _, group, valid, mask, step_end = _inputs()
    rewards = np.array([1, 0, 1, 0, 0, 1, 0, 0], np.float32)
    for r, coef in ((rewards, 0.1), (_inputs()[2], 0.0)):
      fn = lambda lp, r=r, coef=coef: auxiliary.echo_clip_loss(
        lp, entropy, r, group, valid, mask, step_end, num_groups=4, coef=coef
      )[0]
      value, g = jax.value_and_grad(fn)(logprobs)
      np.testing.assert_array_equal(value, 0.0)
      np.testing.assert_array_equal(g, 0.0)

  def test_grpo_gives_degenerate_groups_no_gradient(self):
    """Why the term exists: GRPO's advantage, hence its gradient, is 0 on all-correct groups."""
    logprobs, _, rewards, group, valid, mask, _ = _inputs()
    adv, _ = group_baselines.grpo(rewards, group, valid, num_groups=4)
    g = jax.grad(lambda lp: ppo_family.ppo_clip(lp, logprobs, adv, mask)[0])(logprobs)
    degenerate_rows = np.isin(group, [0, 2])
    np.testing.assert_array_equal(np.asarray(g)[degenerate_rows], 0.0)
    self.assertTrue(np.any(np.asarray(g)[~degenerate_rows] != 0.0))

  def test_registry(self):
    self.assertEqual(set(auxiliary.AUX_LOSSES), {"echorl"})
    self.assertIs(auxiliary.AUX_LOSSES["echorl"], auxiliary.echo_clip_loss)

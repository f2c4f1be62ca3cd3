"""PPO on a vectorised environment that steps on the CPU, written as CleanRL's ppo.py is: 64
copies of a small physics task stepped together in numpy (a chain of 8 masses on springs between
two walls, to be brought to rest by one of 5 pushes on the first mass; observations the 8
positions and 8 velocities, float32; episodes end at 200 steps or when a mass strays), an actor
and a critic on the GPU (MLPs of 3 hidden layers of 256, tanh, orthogonal init, fp32), Adam
(PyTorch's default implementation: foreach on CUDA), random initial states from a seeded
generator.

Each iteration collects a rollout of T = 64 environment steps (4,096 samples): per step the numpy
observations are copied to the GPU (``torch.from_numpy(obs).to(dev)``), the agent's logits and
value computed, an action sampled from ``torch.distributions.Categorical`` and copied back with
``.cpu().numpy()`` for the numpy environment, whose rewards and done flags are copied to the GPU
into the rollout's buffers there. Then the PPO update: GAE in a Python loop over the T steps on
the GPU tensors, then 4 epochs of 4 minibatches of 1,024 (clipped surrogate, value loss, entropy
bonus, advantages normalised per minibatch, gradients clipped to norm 0.5), Adam.

Each iteration is an NVTX range ``iteration`` holding ``rollout`` and ``update``.

Defect: the environment lives on the host, so every environment step is a round trip: the
sampled actions are read back (the CPU waits for the policy's forward) and three small pageable
copies go the other way, each waited for (a copy from pageable memory without ``non_blocking``
synchronises the stream). At 64 environments the policy's forward is some 45 launches of
microsecond kernels, so the rollout's 64 steps are set by the CPU's launching and these waits,
while the GPU idles. ``Categorical``'s default argument validation (``validate_args``, left on,
as in CleanRL) reads a check back for each distribution made and each ``log_prob``, rollout and
update alike: two more waits a step, which no fix below removes. The update's 16 minibatches of
tiny GEMMs are launch-bound too.

    python w_rl_rollout_train.py [--steps 30] [--fix gpu_env] [--fix more_envs] [--fix fused_adam]

Fixes:
  gpu_env     the same environment (the same dynamics, rewards, ends and resets) written in torch
              on the GPU: no copy either way and no read-back of the actions per step; its ~30
              elementwise operations a step are now kernel launches.
  more_envs   256 environments and rollouts of T = 16 steps: the same 4,096 samples an
              iteration (the same minibatches in the update) from a quarter of the environment
              steps, so a quarter of the round trips and of the GAE loop's launches.
  fused_adam  ``Adam(fused=True)``: one kernel over the agent's 16 tensors instead of the
              foreach implementation's passes, 16 times an iteration.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("gpu_env", "more_envs", "fused_adam")
CUDA_ONLY: tuple[str, ...] = ()
MASSES, ACTIONS = 8, 5                     # observation: 8 positions and 8 velocities
K, DAMP, DT, PUSH, LIMIT, BOUND = 4.0, 0.05, 0.05, 1.0, 200, 4.0
GAMMA, LAMBDA, CLIP, ENT, VF = 0.99, 0.95, 0.2, 0.01, 0.5
EPOCHS, MINIBATCHES = 4, 4


class ChainEnv:
    """``n`` spring-mass chains stepped together in numpy (float32), reset where they end."""

    def __init__(self, n: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.x = self.rng.uniform(-1, 1, (n, MASSES)).astype(np.float32)
        self.v = np.zeros((n, MASSES), np.float32)
        self.t = np.zeros(n, np.int64)
        self.ret = np.zeros(n, np.float32)
        self.finished: list[float] = []   # the returns of the episodes that ended

    def obs(self) -> np.ndarray:
        return np.concatenate([self.x, self.v], axis=1)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        force = (action - ACTIONS // 2).astype(np.float32) * PUSH
        padded = np.pad(self.x, ((0, 0), (1, 1)))           # the walls at both ends
        acc = K * (padded[:, :-2] - 2 * self.x + padded[:, 2:]) - DAMP * self.v
        acc[:, 0] += force
        self.v += DT * acc
        self.x += DT * self.v
        self.t += 1
        reward = -(self.x ** 2).mean(axis=1) - 0.01 * force ** 2
        self.ret += reward
        done = (np.abs(self.x).max(axis=1) > BOUND) | (self.t >= LIMIT)
        if done.any():
            self.finished.extend(self.ret[done].tolist())
            m = int(done.sum())
            self.x[done] = self.rng.uniform(-1, 1, (m, MASSES)).astype(np.float32)
            self.v[done] = 0
            self.t[done] = 0
            self.ret[done] = 0
        return self.obs(), reward.astype(np.float32), done

    def episodes(self) -> tuple[int, float]:
        """How many episodes ended, and their mean return."""
        return len(self.finished), float(np.mean(self.finished)) if self.finished else float("nan")


class TorchChainEnv:
    """The same chains in torch on ``dev`` (``gpu_env``): no copy, no read-back; the returns of
    the episodes that ended summed and counted on the device."""

    def __init__(self, n: int, seed: int, dev: torch.device) -> None:
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        self.x = torch.rand(n, MASSES, device=dev, generator=self.gen) * 2 - 1
        self.v = torch.zeros(n, MASSES, device=dev)
        self.t = torch.zeros(n, dtype=torch.long, device=dev)
        self.ret = torch.zeros(n, device=dev)
        self.sum_finished = torch.zeros((), device=dev)
        self.n_finished = torch.zeros((), dtype=torch.long, device=dev)

    def obs(self) -> torch.Tensor:
        return torch.cat([self.x, self.v], dim=1)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        force = (action - ACTIONS // 2).float() * PUSH
        padded = nn.functional.pad(self.x, (1, 1))
        acc = K * (padded[:, :-2] - 2 * self.x + padded[:, 2:]) - DAMP * self.v
        acc[:, 0] += force
        self.v += DT * acc
        self.x += DT * self.v
        self.t += 1
        reward = -(self.x ** 2).mean(dim=1) - 0.01 * force ** 2
        self.ret += reward
        done = (self.x.abs().amax(dim=1) > BOUND) | (self.t >= LIMIT)
        self.sum_finished += (self.ret * done).sum()
        self.n_finished += done.sum()
        fresh = torch.rand(self.x.shape, device=self.x.device, generator=self.gen) * 2 - 1
        keep = ~done[:, None]
        self.x = torch.where(keep, self.x, fresh)
        self.v = self.v * keep
        self.t = self.t * ~done
        self.ret = self.ret * ~done
        return self.obs(), reward, done

    def episodes(self) -> tuple[int, float]:
        """How many episodes ended, and their mean return (read once, at the end)."""
        n = int(self.n_finished.item())
        return n, self.sum_finished.item() / n if n else float("nan")


def layer_init(layer: nn.Linear, std: float = 2 ** 0.5) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(inp: int, hidden: int, out: int, std: float) -> nn.Sequential:
    return nn.Sequential(layer_init(nn.Linear(inp, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, hidden)),
                         nn.Tanh(), layer_init(nn.Linear(hidden, hidden)), nn.Tanh(),
                         layer_init(nn.Linear(hidden, out), std))


class Agent(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.critic = mlp(2 * MASSES, hidden, 1, 1.0)
        self.actor = mlp(2 * MASSES, hidden, ACTIONS, 0.01)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The environments, agent, optimizer and rollout buffers with ``fixes`` applied; returns one
    iteration (a rollout and the PPO update; the last minibatch's loss, kept on the GPU).
    ``step.episodes()``: how many episodes ended, and their mean return."""
    n_envs, horizon, hidden = 64, 64, 256
    if args.small:
        n_envs, horizon, hidden = 8, 8, 32
    if "more_envs" in fixes:  # the same samples an iteration from a quarter of the steps
        n_envs, horizon = 4 * n_envs, horizon // 4
    samples = n_envs * horizon
    minibatch = samples // MINIBATCHES
    torch.manual_seed(0)
    agent = Agent(hidden).to(dev)
    opt = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True if "fused_adam" in fixes else None)
    on_gpu = "gpu_env" in fixes
    env = TorchChainEnv(n_envs, 1, dev) if on_gpu else ChainEnv(n_envs, 1)
    obs = torch.zeros(horizon, n_envs, 2 * MASSES, device=dev)
    actions = torch.zeros(horizon, n_envs, dtype=torch.long, device=dev)
    logprobs, rewards, dones, values = (torch.zeros(horizon, n_envs, device=dev) for _ in range(4))
    state = {"obs": env.obs() if on_gpu else torch.from_numpy(env.obs()).to(dev),
             "done": torch.zeros(n_envs, device=dev)}

    def rollout() -> None:
        next_obs, next_done = state["obs"], state["done"]
        for t in range(horizon):
            obs[t] = next_obs
            dones[t] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[t] = value.flatten()
            actions[t] = action
            logprobs[t] = logprob
            if on_gpu:
                next_obs, reward, done = env.step(action)
                rewards[t] = reward
                next_done = done.float()
            else:
                o, reward, done = env.step(action.cpu().numpy())
                rewards[t] = torch.from_numpy(reward).to(dev).view(-1)
                next_obs, next_done = torch.from_numpy(o).to(dev), torch.from_numpy(done).to(dev).float()
        state["obs"], state["done"] = next_obs, next_done

    def update() -> torch.Tensor:
        with torch.no_grad():  # GAE, one step at a time from the last
            next_value = agent.get_value(state["obs"]).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(horizon)):
                if t == horizon - 1:
                    nextnonterminal, nextvalues = 1.0 - state["done"], next_value
                else:
                    nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + GAMMA * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + GAMMA * LAMBDA * nextnonterminal * lastgaelam
            returns = advantages + values
        b_obs, b_actions, b_logprobs = obs.reshape(-1, 2 * MASSES), actions.reshape(-1), logprobs.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
        for _ in range(EPOCHS):
            perm = torch.randperm(samples, device=dev)
            for start in range(0, samples, minibatch):
                mb = perm[start:start + minibatch]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = b_advantages[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb]) ** 2).mean()
                loss = pg_loss - ENT * entropy.mean() + VF * v_loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                opt.step()
        return loss.detach()

    def step() -> torch.Tensor:
        with nvtx("iteration"):
            with nvtx("rollout"):
                rollout()
            with nvtx("update"):
                return update()
    step.episodes = env.episodes
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    steps_help="PPO iterations, a rollout and an update each "
                                               "(the first ones are warm-up)",
                                    small_help="tiny agent, few environments and short rollouts, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        n, mean = ran[0].episodes()
        print(f"w_rl_rollout_train: {args.steps} iterations, fixes {sorted(fixes) or 'none'}, "
              f"last loss {float(ran[1][-1]):.4f}, {n} episodes ended, mean return {mean:.2f}")


if __name__ == "__main__":
    main()

"""The typed experiment schema.

Every section rejects unknown keys. Training hyperparameters that the user does
not set stay unset, so RLlib's own defaults apply (``rl_app show`` prints them).
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeAlias, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Activation = Literal["tanh", "relu", "swish", "silu", "elu", "linear"]


class Section(BaseModel):
    """Base for every section: unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _check_schedule(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if not points or points[0][0] != 0:
        raise ValueError("a schedule must be [[0, value], [timestep, value], ...]")
    steps = [step for step, _ in points]
    if steps != sorted(steps):
        raise ValueError("schedule timesteps must increase")
    return points


# A piecewise-linear schedule, as RLlib takes it: [[timestep, value], ...].
Schedule = Annotated[list[tuple[NonNegativeInt, float]], AfterValidator(_check_schedule)]


class WrapperSpec(Section):
    """One env wrapper: a name from ``rl_app.envs.WRAPPERS`` or 'package.module:Class', with kwargs.

    Written in YAML as ``- name`` or ``- name: {kwarg: value}``, as RL Zoo's ``env_wrapper``.
    """

    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _as_written(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"name": value}
        if isinstance(value, dict) and len(value) == 1 and "name" not in value:
            (name, kwargs), *_ = value.items()
            return {"name": name, "kwargs": {} if kwargs is None else kwargs}
        return value

    @field_validator("name")
    @classmethod
    def _known_wrapper(cls, name: str) -> str:
        from rl_app.envs import check_wrapper

        check_wrapper(name)
        return name

    @model_serializer(mode="plain")
    def _written(self) -> Any:
        return {self.name: dict(self.kwargs)} if self.kwargs else self.name


class EnvSection(Section):
    id: str = Field(description="Gymnasium env id (CartPole-v1) or 'package.module:Class'.")
    config: dict[str, Any] = Field(default_factory=dict, description="kwargs for the env.")
    wrappers: list[WrapperSpec] | None = Field(
        None, description="Applied in order around the env, in training, evaluation and export alike."
    )

    @field_validator("id")
    @classmethod
    def _known_env(cls, env_id: str) -> str:
        from rl_app.envs import check_env_id

        check_env_id(env_id)
        return env_id


class EnvRunnersSection(Section):
    num_env_runners: NonNegativeInt | Literal["auto"] = Field(
        "auto", description="'auto': one per CPU core minus reserved_cpus."
    )
    reserved_cpus: NonNegativeInt = Field(1, description="Cores kept for driver and learner.")
    num_envs_per_env_runner: PositiveInt = 8
    rollout_fragment_length: PositiveInt | Literal["auto"] = "auto"
    restart_failed_envs: bool = Field(
        True, description="An env raising in step()/reset() is recreated; its episodes are dropped."
    )
    max_env_failures: NonNegativeInt = Field(
        20, description="Env failures in a row (no good step between) before the run stops."
    )
    max_restarts: NonNegativeInt = Field(
        1000,
        description="Crashed remote env runners recreated (all together); one more crash stops the run.",
    )
    runner: Literal["auto", "rllib"] = Field(
        "auto",
        description="'auto': rl_app's batched runner where the experiment fits it (the start says which); "
        "'rllib': RLlib's SingleAgentEnvRunner always.",
    )
    vectorize: Literal["auto", "sync"] = Field(
        "auto",
        description="'auto': the env's own vectorized implementation where it has one: Gymnasium's for "
        "an id without wrappers (CartPole: one numpy step for all envs), ale-py's AtariVectorEnv (C++ "
        "threads) for an ALE id under the atari preset alone; 'sync': Gymnasium's SyncVectorEnv over "
        "single envs always. The two draw different start states for one seed.",
    )
    observation_filter: Literal["MeanStdFilter"] | None = Field(
        None,
        description="Normalise observations by running mean and std (RLlib's MeanStdFilter connector, "
        "synced over env runners, kept in checkpoints and applied by evaluate, export and serve).",
    )


class LearnersSection(Section):
    num_learners: NonNegativeInt = 0
    device: Literal["auto", "cpu", "gpu"] = Field("auto", description="'auto': GPU if visible.")


def _padded(layer: Any) -> Any:
    """RLlib's default padding, written out: a layer of three items pads "same"."""
    return [*layer, "same"] if isinstance(layer, list | tuple) and len(layer) == 3 else layer


# One conv layer as RLlib writes it: [out_channels, kernel, stride, padding], kernel an int or
# [h, w], padding "same" (RLlib's default when left out) or "valid".
ConvFilter: TypeAlias = Annotated[
    tuple[PositiveInt, PositiveInt | tuple[PositiveInt, PositiveInt], PositiveInt, Literal["same", "valid"]],
    BeforeValidator(_padded),
]


class ModelSection(Section):
    """Fields of RLlib's DefaultModelConfig; unset ones keep RLlib's defaults."""

    fcnet_hiddens: list[PositiveInt] | None = None
    fcnet_activation: Activation | None = None
    fcnet_bias_initializer: str | None = None
    head_fcnet_hiddens: list[PositiveInt] | None = None
    head_fcnet_activation: Activation | None = None
    head_fcnet_bias_initializer: str | None = None
    vf_share_layers: bool | None = None
    free_log_std: bool | None = None
    fusionnet_hiddens: list[PositiveInt] | None = None
    fusionnet_activation: Activation | None = None
    conv_filters: list[ConvFilter] | None = Field(
        None,
        description="CNN for image observations: [[channels, kernel, stride(, 'same'|'valid')], ...] "
        "(RLlib's form; padding 'same' unless said).",
    )
    conv_activation: Activation | None = None
    use_lstm: bool | None = Field(
        None, description="An LSTM after the encoder (PPO, APPO, IMPALA): memory for partially observed envs."
    )
    lstm_cell_size: PositiveInt | None = None
    max_seq_len: PositiveInt | None = Field(None, description="Steps per training sequence of the LSTM.")
    ortho_init: bool | None = Field(
        None,
        description=(
            "PPO, APPO, IMPALA: orthogonal weights as SB3 and CleanRL start them (hidden gain sqrt 2, "
            "policy output 0.01, value output 1, zero biases); unset: torch's default, as RLlib."
        ),
    )
    sac_critic: Literal["concat", "multi_stream"] | None = Field(
        None,
        description=(
            "SAC with continuous actions: 'concat' (the default there), one MLP over observation and "
            "action as the SAC paper, SB3 and CleanRL; 'multi_stream', RLlib's separate encoders "
            "joined by a fusion net (fusionnet_*), about 9x the compute at [256, 256]."
        ),
    )


class TrainingSection(Section):
    """Hyperparameters common to every algorithm (RLlib's ``AlgorithmConfig.training``)."""

    lr: PositiveFloat | Schedule | None = None
    gamma: Annotated[float, Field(gt=0, le=1)] | None = None
    train_batch_size_per_learner: PositiveInt | None = None
    minibatch_size: PositiveInt | None = None
    num_epochs: PositiveInt | None = None
    grad_clip: PositiveFloat | None = None


class PPOTraining(TrainingSection):
    lambda_: Fraction | None = Field(None, alias="lambda")
    clip_param: PositiveFloat | None = None
    vf_clip_param: PositiveFloat | None = None
    vf_loss_coeff: Annotated[float, Field(ge=0)] | None = None
    entropy_coeff: Annotated[float, Field(ge=0)] | None = None
    use_kl_loss: bool | None = None
    kl_coeff: Annotated[float, Field(ge=0)] | None = None
    kl_target: PositiveFloat | None = None
    use_gae: bool | None = None


class IMPALATraining(TrainingSection):
    """IMPALA's V-trace actor-critic, learning from batches the env runners sample asynchronously."""

    vtrace: bool | None = None
    vtrace_clip_rho_threshold: PositiveFloat | None = None
    vtrace_clip_pg_rho_threshold: PositiveFloat | None = None
    vf_loss_coeff: Annotated[float, Field(ge=0)] | None = None
    entropy_coeff: Annotated[float, Field(ge=0)] | None = None
    broadcast_interval: PositiveInt | None = Field(None, description="Updates between weight syncs.")
    learner_queue_size: PositiveInt | None = None


class APPOTraining(IMPALATraining):
    """APPO: IMPALA with PPO's clipped surrogate objective and a target network."""

    lambda_: Fraction | None = Field(None, alias="lambda")
    use_gae: bool | None = None
    clip_param: PositiveFloat | None = None
    use_kl_loss: bool | None = None
    kl_coeff: Annotated[float, Field(ge=0)] | None = None
    kl_target: PositiveFloat | None = None
    target_network_update_freq: NonNegativeInt | None = None
    tau: Fraction | None = None
    circular_buffer_num_batches: PositiveInt | None = None
    circular_buffer_iterations_per_batch: PositiveInt | None = None


class QLearningTraining(Section):
    """Tabular Q-learning: continuous observations are cut into ``bins`` per dimension between
    ``low`` and ``high`` (values outside are clipped into the end bins); discrete ones need none."""

    lr: Annotated[float, Field(gt=0, le=1)] = Field(0.1, description="Step size of each Q update.")
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.99
    epsilon: Schedule = Field(
        [(0, 1.0), (100_000, 0.02)], description="[[timestep, epsilon], ...], linear in between"
    )
    bins: list[PositiveInt] | None = Field(None, description="Bins per observation dimension (Box).")
    low: list[float] | None = Field(None, description="Lower clipping bound per dimension.")
    high: list[float] | None = Field(None, description="Upper clipping bound per dimension.")
    num_envs: PositiveInt = Field(16, description="Envs stepped together (a gymnasium vector env).")
    steps_per_iteration: PositiveInt = Field(20_000, description="Env steps per training iteration.")

    @model_validator(mode="after")
    def _bounds_match_bins(self) -> QLearningTraining:
        for key in ("low", "high"):
            value = getattr(self, key)
            if value is not None and (self.bins is None or len(value) != len(self.bins)):
                raise ValueError(f"{key} needs one value per entry of bins")
        if self.low and self.high and any(lo >= hi for lo, hi in zip(self.low, self.high, strict=True)):
            raise ValueError("each low must be below its high")
        return self


class ReplayBufferSection(Section):
    type: Literal["EpisodeReplayBuffer", "PrioritizedEpisodeReplayBuffer"] = "PrioritizedEpisodeReplayBuffer"
    capacity: PositiveInt = 50_000
    alpha: Annotated[float, Field(ge=0)] | None = Field(None, description="Prioritization.")
    beta: Annotated[float, Field(ge=0)] | None = Field(None, description="IS correction.")
    implementation: Literal["auto", "rllib"] = Field(
        "auto",
        description="'auto': rl_app's array buffer and batched update where the experiment fits it "
        "(the start says which); 'rllib': RLlib's episode buffer always.",
    )

    @model_validator(mode="after")
    def _priorities_only_when_prioritized(self) -> ReplayBufferSection:
        if self.type == "EpisodeReplayBuffer" and (self.alpha is not None or self.beta is not None):
            raise ValueError("alpha and beta apply only to type PrioritizedEpisodeReplayBuffer")
        return self


NStep = PositiveInt | tuple[PositiveInt, PositiveInt]


class OffPolicyTraining(TrainingSection):
    replay_buffer: ReplayBufferSection | None = None
    num_steps_sampled_before_learning_starts: NonNegativeInt | None = None
    target_network_update_freq: NonNegativeInt | None = None
    training_intensity: PositiveFloat | None = None
    n_step: NStep | None = None
    tau: Fraction | None = None


class DQNTraining(OffPolicyTraining):
    epsilon: Schedule | None = Field(None, description="[[timestep, epsilon], ...]")
    double_q: bool | None = None
    dueling: bool | None = None


class SoftActorCriticTraining(OffPolicyTraining):
    """What SAC and CQL (SAC with a conservative penalty) share."""

    actor_lr: PositiveFloat | None = None
    critic_lr: PositiveFloat | None = None
    alpha_lr: PositiveFloat | None = None
    initial_alpha: PositiveFloat | None = None
    target_entropy: float | Literal["auto"] | None = None
    twin_q: bool | None = None


class SACTraining(SoftActorCriticTraining):
    critic_loss: Literal["huber", "mse"] | None = Field(
        None,
        description="Each critic's loss on its TD error: RLlib's 'huber' (delta 1, the default) or "
        "'mse', half the squared error, as the SAC paper, SB3 and CleanRL have it (continuous "
        "actions, on rl_app's SAC learner).",
    )


class MARWILTraining(TrainingSection):
    """MARWIL (BC is MARWIL with beta 0): advantage-weighted imitation of recorded actions."""

    beta: Annotated[float, Field(ge=0)] | None = Field(None, description="0: plain behaviour cloning.")
    vf_coeff: Annotated[float, Field(ge=0)] | None = None
    bc_logstd_coeff: Annotated[float, Field(ge=0)] | None = None


class BCTraining(TrainingSection):
    """Behaviour cloning: the recorded actions' log-likelihood, maximised."""


class CQLTraining(SoftActorCriticTraining):
    """Conservative Q-learning: SAC whose Q-values are pushed down away from the recorded actions."""

    bc_iters: NonNegativeInt | None = Field(None, description="Iterations of behaviour cloning first.")
    temperature: PositiveFloat | None = None
    num_actions: PositiveInt | None = Field(None, description="Actions sampled for the CQL loss.")
    min_q_weight: Annotated[float, Field(ge=0)] | None = None
    lagrangian: bool | None = None
    lagrangian_thresh: float | None = None
    deterministic_backup: bool | None = None


class IQLTraining(TrainingSection):
    """Implicit Q-learning: expectile value regression, advantage-weighted actor."""

    beta: PositiveFloat | None = Field(None, description="Inverse temperature of the actor's weights.")
    expectile: Annotated[float, Field(gt=0, lt=1)] | None = None
    actor_lr: PositiveFloat | None = None
    critic_lr: PositiveFloat | None = None
    value_lr: PositiveFloat | None = None
    twin_q: bool | None = None
    target_network_update_freq: NonNegativeInt | None = None
    tau: Fraction | None = None


class OfflineSection(Section):
    """Recorded episodes to learn from (BC, MARWIL, CQL, IQL): ``rl_app record`` writes them."""

    input: str = Field(
        min_length=1,
        description="Folder (or s3://, gs:// URI) of Parquet rows in RLlib's columns (rl_app record).",
    )
    updates_per_iteration: PositiveInt | None = Field(
        None, description="Batches the learner trains on per iteration (default: 1; CQL: 5)."
    )


class SelfPlaySection(Section):
    """One policy learns against a frozen copy of itself: in each episode one agent (the next in
    turn) plays ``learner`` and the others ``opponent``, whose weights become the learner's whenever
    the learner's mean return over an iteration's episodes reaches ``refresh_return``."""

    learner: str = Field(min_length=1)
    opponent: str = Field(min_length=1)
    refresh_return: float = Field(
        0.5,
        description="Learner's mean episode return that refreshes the opponent (±1 games: wins - losses).",
    )


class MultiAgentSection(Section):
    """Several agents (a PettingZoo env or an RLlib MultiAgentEnv): which policies act for whom."""

    policies: Literal["shared", "per_agent"] | list[str] = Field(
        "shared",
        description="'shared': one policy, 'shared', for every agent; 'per_agent': one per agent id, "
        "named as the agent; or a list of names, with mapping (or self_play) saying who uses which.",
    )
    mapping: dict[str, str] = Field(
        default_factory=dict,
        description="Agent id pattern (fnmatch: 'pursuer_*') -> policy; the first pattern that matches wins.",
    )
    train: list[str] | None = Field(
        None, description="Policies that learn (default: all but a self-play opponent)."
    )
    self_play: SelfPlaySection | None = None

    @model_validator(mode="after")
    def _names_agree(self) -> MultiAgentSection:
        if isinstance(self.policies, str):
            if self.mapping or self.self_play:
                key = "mapping" if self.mapping else "self_play"
                raise ValueError(
                    f"{key} needs named policies (policies: [a, b, ...]), not policies: {self.policies}"
                )
            return self
        names = self.policies
        if not names or len(set(names)) != len(names):
            raise ValueError("policies: name each policy once")
        known = f"(allowed: {', '.join(names)})"
        for pattern, policy in self.mapping.items():
            if policy not in names:
                raise ValueError(f"mapping '{pattern}' names unknown policy '{policy}' {known}")
        for policy in self.train or ():
            if policy not in names:
                raise ValueError(f"train names unknown policy '{policy}' {known}")
        play = self.self_play
        if play is not None:
            for role in ("learner", "opponent"):
                if getattr(play, role) not in names:
                    raise ValueError(f"self_play.{role} names unknown policy '{getattr(play, role)}' {known}")
            if play.learner == play.opponent:
                raise ValueError("self_play: the learner and its opponent are two policies")
            if self.mapping:
                raise ValueError(
                    "mapping: self_play maps the agents itself (one learner per episode, in turn)"
                )
            if play.opponent in (self.train or ()):
                raise ValueError(
                    f"train: self_play's opponent '{play.opponent}' is frozen; it does not learn"
                )
        elif not self.mapping:
            raise ValueError("mapping: say which agents each of the named policies acts for")
        return self

    def policy_names(self, agents: list[str]) -> list[str]:
        """The policies, given the env's agent ids (``per_agent`` names one per agent)."""
        if self.policies == "shared":
            return ["shared"]
        if self.policies == "per_agent":
            return list(agents)
        return list(self.policies)

    def trained(self, agents: list[str]) -> list[str]:
        """The policies that learn."""
        if self.train is not None:
            return list(self.train)
        frozen = self.self_play.opponent if self.self_play else None
        return [name for name in self.policy_names(agents) if name != frozen]


class StopSection(Section):
    """Training stops at the first criterion met."""

    timesteps: PositiveInt | None = Field(None, description="Env steps sampled.")
    return_: float | None = Field(None, alias="return", description="Mean episode return.")
    time_s: PositiveFloat | None = Field(None, description="Wall-clock seconds of training.")
    iterations: PositiveInt | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> StopSection:
        if all(v is None for v in (self.timesteps, self.return_, self.time_s, self.iterations)):
            raise ValueError("set at least one of timesteps, return, time_s, iterations")
        return self


class CheckpointSection(Section):
    every: PositiveInt = Field(10, description="Checkpoint every N iterations.")
    keep: PositiveInt = Field(3, description="Keep the last K checkpoints, plus the best by return.")
    replay_buffer: bool = Field(
        True, description="Save the replay buffer with each checkpoint (off-policy algorithms)."
    )


class EvaluationSection(Section):
    interval: NonNegativeInt = Field(0, description="Evaluate every N iterations; 0 = never.")
    episodes: PositiveInt = 10
    num_env_runners: NonNegativeInt = 0
    explore: bool = Field(False, description="False: deterministic (greedy) actions.")


class TrackingSection(Section):
    """Where else the run is recorded: an MLflow tracking server (``--track`` turns it on too)."""

    mlflow: bool = Field(
        False,
        description="Log params, metrics and artifacts to MLflow ($MLFLOW_TRACKING_URI, else ./mlruns).",
    )
    experiment_name: str | None = Field(
        None, min_length=1, description="MLflow experiment (default: this experiment's name)."
    )


SPACE_KINDS = ("choice", "grid", "uniform", "loguniform", "randint", "quniform")


class SpaceEntry(Section):
    """How one hyperparameter is sampled: exactly one of the keys below (Ray Tune's semantics)."""

    choice: list[Any] | None = Field(None, description="Sample one of these values.")
    grid: list[Any] | None = Field(None, description="Try every value (crossed with other grids).")
    uniform: tuple[float, float] | None = Field(None, description="[low, high]")
    loguniform: tuple[PositiveFloat, PositiveFloat] | None = Field(None, description="[low, high], log scale")
    randint: tuple[int, int] | None = Field(None, description="[low, high): high excluded, as in Tune")
    quniform: tuple[float, float, PositiveFloat] | None = Field(None, description="[low, high, step]")

    @model_validator(mode="after")
    def _exactly_one_valid_kind(self) -> SpaceEntry:
        given = [kind for kind in SPACE_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(SPACE_KINDS)}")
        kind, args = given[0], getattr(self, given[0])
        if kind in ("choice", "grid"):
            if not args:
                raise ValueError(f"{kind} needs at least one value")
        elif args[0] >= args[1]:
            raise ValueError(f"{kind} needs low < high (got [{args[0]:g}, {args[1]:g}])")
        return self

    @model_serializer(mode="plain")
    def _as_written(self) -> dict[str, Any]:
        return {self.kind: list(self.args)}

    @property
    def kind(self) -> str:
        return next(kind for kind in SPACE_KINDS if getattr(self, kind) is not None)

    @property
    def args(self) -> Any:
        return getattr(self, self.kind)

    def candidates(self) -> list[Any]:
        """Values that bound what can be sampled: all of a list, the ends of a range."""
        args = self.args
        if self.kind in ("choice", "grid"):
            return list(args)
        if self.kind == "randint":
            return [args[0], args[1] - 1]
        return [args[0], args[1]]


class SchedulerSection(Section):
    """Trial scheduler: FIFO runs every trial to its stop criteria; ASHA and PBT act on the metric."""

    type: Literal["fifo", "asha", "pbt"] = "fifo"
    time_attr: Literal["timesteps", "iterations"] = Field(
        "timesteps", description="Unit of max_t, grace_period and perturbation_interval."
    )
    max_t: PositiveInt | None = Field(None, description="ASHA: longest trial (default: the trial stop).")
    grace_period: PositiveInt | None = Field(None, description="ASHA: shortest trial before pruning.")
    reduction_factor: Annotated[float, Field(gt=1)] = Field(3, description="ASHA: keep 1/factor per rung.")
    perturbation_interval: PositiveInt | None = Field(None, description="PBT: exploit/explore every N.")
    quantile_fraction: Annotated[float, Field(gt=0, le=0.5)] = Field(
        0.25, description="PBT: bottom fraction that copies the top fraction."
    )
    resample_probability: Fraction = Field(0.25, description="PBT: resample instead of perturbing.")

    @model_validator(mode="after")
    def _settings_match_type(self) -> SchedulerSection:
        asha_only = ("max_t", "grace_period")
        for name in asha_only:
            if self.type != "asha" and getattr(self, name) is not None:
                raise ValueError(f"{name} applies only to type asha")
        if self.type != "pbt" and self.perturbation_interval is not None:
            raise ValueError("perturbation_interval applies only to type pbt")
        if self.type == "pbt" and self.perturbation_interval is None:
            raise ValueError("type pbt needs perturbation_interval")
        if self.max_t is not None and self.grace_period is not None and self.grace_period > self.max_t:
            raise ValueError("grace_period must be <= max_t")
        return self


class SweepSection(Section):
    """A Ray Tune sweep over this experiment: ``rl_app sweep EXP``; ``rl_app train`` ignores it."""

    space: dict[str, SpaceEntry] = Field(
        min_length=1, description="Dotted experiment key -> {choice|grid|uniform|...: ...}."
    )
    search: Literal["random", "grid", "optuna"] = Field(
        "random", description="random: Tune's variant generator (grid entries crossed); optuna: TPE."
    )
    metric: Literal["return", "eval_return"] | None = Field(
        None, description="Default: eval_return when evaluation is on, else return."
    )
    mode: Literal["max", "min"] = "max"
    num_samples: PositiveInt | None = Field(
        None, description="Trials to sample (default 8; grid search: 1 pass over the grid)."
    )
    max_concurrent_trials: PositiveInt | Literal["auto"] = Field(
        "auto", description="'auto': as many as the CPUs allow (printed at the start)."
    )
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)  # type: ignore[arg-type]
    stop: StopSection | None = Field(None, description="Per-trial stop (default: the experiment's).")
    seed: NonNegativeInt | None = Field(None, description="Search seed (default: the experiment's).")
    max_failures: NonNegativeInt = Field(1, description="Retries of a crashed trial before it errors.")


T = TypeVar("T", bound=Section)


class Experiment(Section, Generic[T]):
    """One named experiment: what to train, on what, for how long."""

    description: str = ""
    algorithm: str
    env: EnvSection
    training: T
    model: ModelSection = Field(default_factory=ModelSection)  # type: ignore[arg-type]
    env_runners: EnvRunnersSection = Field(default_factory=EnvRunnersSection)  # type: ignore[arg-type]
    learners: LearnersSection = Field(default_factory=LearnersSection)  # type: ignore[arg-type]
    stop: StopSection
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)  # type: ignore[arg-type]
    evaluation: EvaluationSection = Field(default_factory=EvaluationSection)  # type: ignore[arg-type]
    seed: NonNegativeInt | None = 0
    acceleration: Literal["auto", "off"] = Field(
        "auto",
        description="auto: rl_app's faster parts where they apply; off: RLlib's own classes throughout.",
    )
    tuning_seeds: list[NonNegativeInt] = Field(
        default_factory=list,
        description="Seeds its settings were chosen on; benches report figures on other seeds.",
    )
    tracking: TrackingSection = Field(default_factory=TrackingSection)  # type: ignore[arg-type]
    offline: OfflineSection | None = Field(None, description="Learn from recorded data (offline algorithms).")
    multi_agent: MultiAgentSection | None = Field(
        None, description="Several agents: the policies and which agent each acts for."
    )
    storage: str | None = Field(
        None, description="Mirror run folders to this local path or URI (s3://, gs://, ...)."
    )
    extends: str | None = Field(None, description="Name of an experiment this one builds on.")
    sweep: SweepSection | None = Field(None, description="Hyperparameter sweep (rl_app sweep).")

    @field_validator("acceleration", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare off/on as false/true.
        return {False: "off", True: "auto"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("env", mode="before")
    @classmethod
    def _env_shorthand(cls, value: Any) -> Any:
        return {"id": value} if isinstance(value, str) else value


# An experiment of any algorithm, as every module past the loader sees it.
ExperimentConfig: TypeAlias = Experiment[TrainingSection]

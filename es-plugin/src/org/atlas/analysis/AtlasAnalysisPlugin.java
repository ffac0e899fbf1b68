package org.atlas.analysis;

import java.util.Map;
import java.util.function.UnaryOperator;
import java.util.regex.Pattern;

import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.analysis.CharArraySet;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.core.WhitespaceTokenizer;
import org.apache.lucene.analysis.email.UAX29URLEmailTokenizer;
import org.apache.lucene.analysis.en.EnglishAnalyzer;
import org.apache.lucene.analysis.pattern.PatternCaptureGroupTokenFilter;
import org.apache.lucene.analysis.standard.StandardAnalyzer;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.env.Environment;
import org.elasticsearch.index.IndexSettings;
import org.elasticsearch.index.analysis.AbstractIndexAnalyzerProvider;
import org.elasticsearch.index.analysis.Analysis;
import org.elasticsearch.index.analysis.AnalyzerProvider;
import org.elasticsearch.index.analysis.TokenFilterFactory;
import org.elasticsearch.index.analysis.TokenizerFactory;
import org.elasticsearch.indices.analysis.AnalysisModule.AnalysisProvider;
import org.elasticsearch.plugins.AnalysisPlugin;
import org.elasticsearch.plugins.Plugin;

/**
 * The analysis components Atlas's Elasticsearch node lacks.
 *
 * <p>Atlas runs the {@code integ-test-zip} distribution, which ships without the
 * {@code analysis-common} module. The {@code email} analyzer of the {@code .security} system
 * index uses its {@code uax_url_email} tokenizer and its {@code pattern_capture} and
 * {@code unique} token filters, so without them that index cannot be created: no API keys,
 * no native roles. Atlas's own indices use its {@code whitespace} tokenizer and its
 * {@code english} analyzer (BM25 over stemmed text without stop words). This plugin registers
 * just those five, under the same names and settings as {@code analysis-common}, on top of
 * Lucene's own implementations ({@code lowercase} is built into the server).
 */
public class AtlasAnalysisPlugin extends Plugin implements AnalysisPlugin {

    /** Both honour {@code max_token_length} (default 255, as in Lucene); longer tokens are split. */
    @Override
    public Map<String, AnalysisProvider<TokenizerFactory>> getTokenizers() {
        return Map.of(
            "whitespace", (indexSettings, env, name, settings) -> {
                int max = maxTokenLength(settings);
                return TokenizerFactory.newFactory(name, () -> new WhitespaceTokenizer(max));
            },
            "uax_url_email", (indexSettings, env, name, settings) -> {
                int max = maxTokenLength(settings);
                return TokenizerFactory.newFactory(name, () -> {
                    UAX29URLEmailTokenizer tokenizer = new UAX29URLEmailTokenizer();
                    tokenizer.setMaxTokenLength(max);
                    return tokenizer;
                });
            });
    }

    /**
     * Lucene's EnglishAnalyzer: standard tokenizer, possessive 's removed, lowercase, stop words
     * (setting {@code stopwords}, default {@code _english_}), {@code stem_exclusion}, Porter stemmer.
     */
    @Override
    public Map<String, AnalysisProvider<AnalyzerProvider<? extends Analyzer>>> getAnalyzers() {
        return Map.of("english", (indexSettings, env, name, settings) -> {
            CharArraySet stopwords = Analysis.parseStopWords(env, settings, EnglishAnalyzer.getDefaultStopSet());
            CharArraySet excluded = Analysis.parseStemExclusion(settings, CharArraySet.EMPTY_SET);
            EnglishAnalyzer analyzer = new EnglishAnalyzer(stopwords, excluded);
            return new AbstractIndexAnalyzerProvider<EnglishAnalyzer>(name) {
                @Override
                public EnglishAnalyzer get() {
                    return analyzer;
                }
            };
        });
    }

    private static int maxTokenLength(Settings settings) {
        return settings.getAsInt("max_token_length", StandardAnalyzer.DEFAULT_MAX_TOKEN_LENGTH);
    }

    @Override
    public Map<String, AnalysisProvider<TokenFilterFactory>> getTokenFilters() {
        return Map.of(
            // Needs its `patterns`, so it cannot be used by bare name (e.g. in _analyze without an index).
            "pattern_capture", AnalysisPlugin.requiresAnalysisSettings(AtlasAnalysisPlugin::patternCapture),
            "unique", AtlasAnalysisPlugin::unique);
    }

    /** Emits every capture group of every pattern, plus the original token unless preserve_original is false. */
    private static TokenFilterFactory patternCapture(IndexSettings index, Environment env, String name, Settings settings) {
        var regexes = settings.getAsList("patterns");
        if (regexes.isEmpty()) {
            throw new IllegalArgumentException("[patterns] is required for the [pattern_capture] filter [" + name + "]");
        }
        Pattern[] patterns = regexes.stream().map(Pattern::compile).toArray(Pattern[]::new);
        boolean preserveOriginal = settings.getAsBoolean("preserve_original", true);
        return filter(name, in -> new PatternCaptureGroupTokenFilter(in, preserveOriginal, patterns));
    }

    private static TokenFilterFactory unique(IndexSettings index, Environment env, String name, Settings settings) {
        boolean onlyOnSamePosition = settings.getAsBoolean("only_on_same_position", false);
        return filter(name, in -> new UniqueTokenFilter(in, onlyOnSamePosition));
    }

    private static TokenFilterFactory filter(String name, UnaryOperator<TokenStream> wrap) {
        return new TokenFilterFactory() {
            @Override
            public String name() {
                return name;
            }

            @Override
            public TokenStream create(TokenStream tokenStream) {
                return wrap.apply(tokenStream);
            }
        };
    }
}
